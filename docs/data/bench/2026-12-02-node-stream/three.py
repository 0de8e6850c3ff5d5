import sys, math, collections
d=collections.defaultdict(list); jobs=collections.defaultdict(list); order=[]
for f in sys.argv[1:]:
  for l in open(f):
    if l.startswith('##'): t=l.split(); lib=t[6]; np_=t[4]; r=f+t[2]
    else:
        t=l.split()
        if len(t)==7:
            d[(lib,np_,t[0])].append(float(t[4])/float(t[2]))
            jobs[(r,np_,lib)].append(float(t[4])/float(t[2]))
def gm(v): return math.exp(sum(math.log(x) for x in v)/len(v))
libs=sorted(set(k[0] for k in d))
kinds=sorted(set(k[2] for k in d))
print("MPI/weft geomean per kind and np (min):", libs)
for k in kinds:
  for np_ in ['3','4','8']:
    print("%-15s %s "%(k,np_)+"  ".join("%s %.2f (%.2f)"%(lib,gm(d[(lib,np_,k)]),min(d[(lib,np_,k)])) for lib in libs))
for lib in libs:
    allv=[x for (l,n,k),v in d.items() if l==lib for x in v]
    jj=sorted(gm(v) for (r,n,l),v in jobs.items() if l==lib)
    print(lib,"all %.2f cells<1 %d/%d min %.2f | job geomeans lowest %s"%(gm(allv),sum(x<1 for x in allv),len(allv),min(allv)," ".join("%.2f"%x for x in jj[:6])))
