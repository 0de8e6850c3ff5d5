import sys, math, collections
d=collections.defaultdict(list)
jobs=collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith('##'): t=l.split(); lib=t[6]; np_=t[4]; r=t[2]
    else:
        t=l.split()
        if len(t)==7:
            d[(lib,np_,t[0],int(t[1]))].append(float(t[4])/float(t[2]))
            jobs[(r,np_,lib)].append(float(t[4])/float(t[2]))
def gm(v): return math.exp(sum(math.log(x) for x in v)/len(v))
kinds=["allreduce","reduce","reduce_scatter","allgather","scatter","gather","alltoall"]
sizes=sorted(set(k[3] for k in d))
print("MPI time / weft time (default comm), geomean over 8 jobs [min]; before -> after")
for k in kinds:
  for np_ in ['3','4','8']:
    row=[]
    for s in sizes:
        b=d[('before',np_,k,s)]; a=d[('final',np_,k,s)]
        row.append("%.2f[%.2f]->%.2f[%.2f]"%(gm(b),min(b),gm(a),min(a)))
    print(k,np_," ".join(row))
for lib in ['before','final']:
    allv=[x for (l,n,k,s),v in d.items() if l==lib for x in v]
    print(lib,"all cells geomean %.2f  cells<1: %d/%d  min %.2f"%(gm(allv),sum(x<1 for x in allv),len(allv),min(allv)))
    jj=[gm(v) for (r,n,l),v in jobs.items() if l==lib]
    print(lib,"per-job geomeans: min %.2f max %.2f, jobs<1.2: %d"%(min(jj),max(jj),sum(x<1.2 for x in jj)))
