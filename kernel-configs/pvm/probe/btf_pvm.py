# Issue 17 probe (Shoal, our own code): dump the PVM-related enums and structs
# of the running kernel from its BTF (/sys/kernel/btf/vmlinux). Run: python3 btf_pvm.py
import struct,sys
d=open('/sys/kernel/btf/vmlinux','rb').read()
magic,ver,fl,hl,to,tl,so,sl=struct.unpack_from('<HBBIIIII',d,0)
T=d[hl+to:hl+to+tl]; S=d[hl+so:hl+so+sl]
def s(o): return S[o:S.index(b'\0',o)].decode()
types=[None]; p=0
while p<len(T):
    n,info,sz=struct.unpack_from('<III',T,p); p+=12
    k=(info>>24)&0x1f; vl=info&0xffff; extra=[]
    if k==1: p+=4
    elif k==3: extra=struct.unpack_from('<III',T,p); p+=12
    elif k in(4,5): extra=[struct.unpack_from('<III',T,p+12*i) for i in range(vl)]; p+=12*vl
    elif k==6: extra=[struct.unpack_from('<Ii',T,p+8*i) for i in range(vl)]; p+=8*vl
    elif k==13: extra=[struct.unpack_from('<II',T,p+8*i) for i in range(vl)]; p+=8*vl
    elif k in(14,17): p+=4
    elif k==15: p+=12*vl
    elif k==19: extra=[struct.unpack_from('<III',T,p+12*i) for i in range(vl)]; p+=12*vl
    types.append((k,s(n),info,sz,extra))
def tname(i,depth=0):
    if i==0: return 'void'
    k,n,info,sz,ex=types[i]
    if k==2: return tname(sz)+'*'
    if k==3: return '%s[%d]'%(tname(ex[0]),ex[2])
    if k in (9,10,11,18): return tname(sz)
    pre={4:'struct ',5:'union ',6:'enum ',7:'fwd '}.get(k,'')
    return pre+(n or '<anon>')
want=sys.argv[1:]
for i,t in enumerate(types):
    if not t: continue
    k,n,info,sz,ex=t
    if k==6:
        names=[s(a) for a,b in ex]
        if any('PVM' in x for x in names) or 'pvm' in n.lower():
            print('enum',n or '<anon>',' '.join('%s=%#x'%(s(a),b&0xffffffff) for a,b in ex))
    if k in(4,5) and ('pvm' in n.lower() or n in want):
        print(('struct' if k==4 else 'union'),n,'size',sz)
        for a,ty,off in ex:
            bo=off&0xffffff if info>>31 else off
            print('   +%d %s %s'%(bo//8,tname(ty),s(a)))
