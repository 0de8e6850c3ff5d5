import sys, math, collections
d=collections.defaultdict(list); dm=collections.defaultdict(list)
for f in sys.argv[2:]:
  for l in open(f):
    if l.startswith('##'): t=l.split(); lib=t[6]; np_=t[4]
    else:
        t=l.split()
        if len(t)==7 and lib==sys.argv[1] and int(t[1])>65536:
            d[t[0]].append(float(t[3])/float(t[2])); dm[t[0]].append(float(t[4])/float(t[2]))
def gm(v): return math.exp(sum(math.log(x) for x in v)/len(v))
for k in sorted(d): print("%-15s msgs/weft %.2f (min %.2f, <1: %d/%d)  mpi/weft %.2f (min %.2f)"%(k,gm(d[k]),min(d[k]),sum(x<1 for x in d[k]),len(d[k]),gm(dm[k]),min(dm[k])))
