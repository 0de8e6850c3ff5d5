/* Links against an installed weft and calls into it without starting MPI:
 * proves the header, the library and its dependencies are all found. */
#include <stdio.h>
#include <string.h>
#include <weft.h>

int main(void)
{
    const char *ok = weft_strerror(WEFT_SUCCESS);
    const char *trunc = weft_strerror(WEFT_ERR_TRUNCATE);
    if (ok == NULL || trunc == NULL || trunc[0] == '\0' || strcmp(ok, trunc) == 0) {
        fprintf(stderr, "weft_strerror gave unusable strings\n");
        return 1;
    }
    printf("weft %d.%d.%d: WEFT_ERR_TRUNCATE = \"%s\"\n",
           WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH, trunc);
    return 0;
}
