"""Per collective, np and size from LO to HI bytes: the median over the three
rounds of weft/MPI (same job), before -> after.  Run from this directory:
    python3 cmp.py 32768 2097152 > mid-sizes.txt
"""
import csv,statistics as st,sys
kinds=["allreduce","reduce","reduce_scatter","allgather","gather","alltoall","bcast","scatter"]
lo,hi=int(sys.argv[1]),int(sys.argv[2])
for k in kinds:
  for np in (2,4,8):
    res={}
    for m in ("before","after"):
      for i in (1,2,3):
        t={}
        for r in csv.DictReader(l for l in open(f"{m}/round{i}/{k}-np{np}.csv") if l.strip() and not l.startswith('#')):
          b=int(r['bytes'])
          if b<lo or b>hi: continue
          t.setdefault(b,{}).setdefault(r['library'],float(r['time_us']))
        for b,d in t.items(): res.setdefault((m,b),[]).append(d['weft']/d['MPI'])
    sizes=sorted({b for (_,b) in res})
    print(f"{k:14s} np{np}", " ".join(f"{b>>10}K {st.median(res[('before',b)]):.2f}>{st.median(res[('after',b)]):.2f}" for b in sizes))
