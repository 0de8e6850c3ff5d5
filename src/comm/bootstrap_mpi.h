/*
 * The MPI bootstrap (bootstrap_mpi.c): MPI_Comm_dup of the user's comm,
 * then MPI collectives on the duplicate.
 */
#ifndef WEFT_BOOTSTRAP_MPI_H
#define WEFT_BOOTSTRAP_MPI_H

#include "comm.h"

/* MPI initialised and not finalised, mpi_comm not MPI_COMM_NULL. */
int weft_bootstrap_mpi_check(weft_mpi_comm_t mpi_comm);
int weft_bootstrap_mpi_create(weft_mpi_comm_t mpi_comm, struct weft_core *core, struct weft_bootstrap **out);

#endif
