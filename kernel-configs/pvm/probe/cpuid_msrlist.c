/* Issue 17 feasibility probe (Shoal, our own code). Build: gcc -O1 -o /tmp/p cpuid_msrlist.c && /tmp/p
 * Needs /dev/kvm; creates a VM and vCPU, runs no guest code. See ../README.md. */
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>
int main(void){
  int kvm=open("/dev/kvm",O_RDWR); if(kvm<0){perror("kvm");return 1;}
  printf("api=%d\n", ioctl(kvm,KVM_GET_API_VERSION,0));
  int n=256; struct kvm_cpuid2 *c=calloc(1,sizeof(*c)+n*sizeof(struct kvm_cpuid_entry2)); c->nent=n;
  if(ioctl(kvm,KVM_GET_SUPPORTED_CPUID,c)<0){perror("cpuid");return 1;}
  for(unsigned i=0;i<c->nent;i++){struct kvm_cpuid_entry2*e=&c->entries[i];
    if(e->function>=0x40000000 && e->function<0x50000000){
      char s[13]={0}; *(unsigned*)s=e->ebx;*(unsigned*)(s+4)=e->ecx;*(unsigned*)(s+8)=e->edx;
      printf("leaf %#x idx %u flags %#x: eax=%#010x ebx=%#010x ecx=%#010x edx=%#010x '%.12s'\n",e->function,e->index,e->flags,e->eax,e->ebx,e->ecx,e->edx,s);}
  }
  printf("nent=%u\n",c->nent);
  for(unsigned i=0;i<c->nent;i++){struct kvm_cpuid_entry2*e=&c->entries[i]; if(e->function<0x40000000) continue; if(e->function>=0x40000000&&e->function<0x50000000) continue;
    printf("leaf %#x idx %u: %08x %08x %08x %08x\n",e->function,e->index,e->eax,e->ebx,e->ecx,e->edx);}
  /* MSR index list */
  struct kvm_msr_list *l=calloc(1,sizeof(*l)+1024*4); l->nmsrs=1024;
  if(ioctl(kvm,KVM_GET_MSR_INDEX_LIST,l)<0) perror("msrlist"); else { printf("msrs(%u):",l->nmsrs); for(unsigned i=0;i<l->nmsrs;i++) if(l->indices[i]>=0x4b564d00 || (l->indices[i]&0xffff0000)==0x4b560000) printf(" %#x",l->indices[i]); printf("\n"); }
  l->nmsrs=1024;
  if(ioctl(kvm,KVM_GET_MSR_FEATURE_INDEX_LIST,l)<0) perror("featmsr"); else {printf("feat msrs %u\n", l->nmsrs);}
  for(int cap=0;cap<260;cap++){int r=ioctl(kvm,KVM_CHECK_EXTENSION,cap); if(r>0 && cap>=200) printf("cap %d=%d\n",cap,r);}
  return 0;}
