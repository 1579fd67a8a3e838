/* Issue 17 feasibility probe (Shoal, our own code). Build: gcc -O1 -o /tmp/p pvm_msrs.c && /tmp/p
 * Needs /dev/kvm; creates a VM and vCPU, runs no guest code. See ../README.md. */
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>
struct { struct kvm_msrs h; struct kvm_msr_entry e[1]; } m;
static int get(int v,unsigned i,unsigned long long*d){memset(&m,0,sizeof m);m.h.nmsrs=1;m.e[0].index=i;int r=ioctl(v,KVM_GET_MSRS,&m);*d=m.e[0].data;return r;}
static int set(int v,unsigned i,unsigned long long d){memset(&m,0,sizeof m);m.h.nmsrs=1;m.e[0].index=i;m.e[0].data=d;return ioctl(v,KVM_SET_MSRS,&m);}
int main(void){
  int kvm=open("/dev/kvm",O_RDWR), vm=ioctl(kvm,KVM_CREATE_VM,0); int v=ioctl(vm,KVM_CREATE_VCPU,0);
  unsigned long long d;
  for(unsigned i=0x4b564df0;i<=0x4b564df6;i++) printf("SET %#x=0x1000 -> %d\n",i,set(v,i,0x1000));
  for(unsigned i=0x4b564d10;i<=0x4b564d17;i++){int r=get(v,i,&d); printf("GET %#x r=%d %#llx; ",i,r,d); printf("SET 0 -> %d, SET 0x1000 -> %d; ",set(v,i,0),set(v,i,0x1000)); get(v,i,&d); printf("now %#llx\n",d);}
  int v1=ioctl(vm,KVM_CREATE_VCPU,1); get(v1,0x4b564d13,&d); printf("vcpu1 0x4b564d13=%#llx\n",d);
  int vm2=ioctl(kvm,KVM_CREATE_VM,0); int w=ioctl(vm2,KVM_CREATE_VCPU,0); get(w,0x4b564d13,&d); printf("vm2 0x4b564d13=%#llx\n",d);
  get(w,0x4b564d12,&d); printf("vm2 0x4b564d12=%#llx\n",d);
  return 0;}
