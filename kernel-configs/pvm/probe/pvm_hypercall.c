/* Issue 17 probe (Shoal, our own code): does the host answer hypercalls from guest CPL 0?
 * Build: gcc -O1 -o /tmp/hc hc.c; run: /tmp/hc 0. rdmsr of the signature MSR 0x4b564d11,
 * then a standard KVM hypercall (vmmcall, nr 1 = KVM_HC_VAPIC_POLL_IRQ), then nr 0x1009
 * (the host's PVM_HC_HALT) by vmmcall and by vmcall; each result is stored to an unbacked
 * GPA (one MMIO exit each). KVM_RUN is interrupted after 2 s (SIGALRM) and the regs and
 * the bytes at the first hypercall site are printed. "/tmp/hc 0 syscall" makes the first
 * hypercall "eax=0x1009; syscall" instead (upstream PVM's hypercall instruction). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <linux/kvm.h>
#include <signal.h>
#include <unistd.h>
#include <errno.h>
static void on_alarm(int sig){(void)sig;}
int main(int argc,char**argv){
  setvbuf(stdout,0,_IONBF,0);
  signal(SIGALRM,on_alarm); siginterrupt(SIGALRM,1);
  int cpl = argc>1 ? atoi(argv[1]) : 3;
  int kvm=open("/dev/kvm",O_RDWR), vm=ioctl(kvm,KVM_CREATE_VM,0);
  size_t sz=0x200000; unsigned char*m=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  struct kvm_userspace_memory_region r={0,0,0,sz,(unsigned long)m};
  if(ioctl(vm,KVM_SET_USER_MEMORY_REGION,&r)<0){perror("mem");return 1;}
  unsigned long long*pml4=(void*)(m+0x1000),*pdpt=(void*)(m+0x2000),*pd=(void*)(m+0x3000);
  pml4[0]=0x2000|7; pdpt[0]=0x3000|7; pd[0]=0x0|0x87; pd[1]=0x200000|0x87; /* 2 MiB pages, U/W/P */
  unsigned long long*gdt=(void*)(m+0x500);
  gdt[1]=0x00209a0000000000ULL; gdt[2]=0x0000920000000000ULL;           /* kernel cs/ds */
  gdt[3]=0x0020fa0000000000ULL; gdt[4]=0x0000f20000000000ULL;           /* user cs/ds (DPL3) */
  unsigned char code[]={
    0xb9,0x11,0x4d,0x56,0x4b,0x0f,0x32,               /* rdmsr 0x4b564d11 */
    0x89,0x04,0x25,0x00,0x00,0x20,0x00,               /* mov [0x200000],eax */
    0xb8,0x01,0x00,0x00,0x00,0x0f,0x01,0xd9,          /* eax=1 (KVM_HC_VAPIC_POLL_IRQ); vmmcall */
    0x89,0x04,0x25,0x04,0x00,0x20,0x00,               /* mov [0x200004],eax */
    0xb8,0x09,0x10,0x00,0x00,0x0f,0x01,0xd9,          /* eax=0x1009 (PVM_HC_HALT); vmmcall */
    0x89,0x04,0x25,0x08,0x00,0x20,0x00,               /* mov [0x200008],eax */
    0xb8,0x09,0x10,0x00,0x00,0x0f,0x01,0xc1,          /* eax=0x1009; vmcall */
    0x89,0x04,0x25,0x0c,0x00,0x20,0x00,               /* mov [0x20000c],eax */
    0xc7,0x04,0x25,0x10,0x00,0x20,0x00,0x44,0x4f,0x4e,0x45, /* 'DONE' */
    0xeb,0xfe};
  memcpy(m+0x10000,code,sizeof code);
  if(argc>2 && !strcmp(argv[2],"syscall")){ /* first hypercall: eax=0x1009; syscall; nop */
    unsigned char sc[]={0xb8,0x09,0x10,0x00,0x00,0x0f,0x05,0x90}; memcpy(m+0x10000+0x0e,sc,sizeof sc);}
  int v=ioctl(vm,KVM_CREATE_VCPU,0); int rs=ioctl(kvm,KVM_GET_VCPU_MMAP_SIZE,0);
  struct kvm_run*run=mmap(0,rs,PROT_READ|PROT_WRITE,MAP_SHARED,v,0);
  struct kvm_cpuid2*c=calloc(1,sizeof(*c)+256*sizeof(struct kvm_cpuid_entry2)); c->nent=256;
  ioctl(kvm,KVM_GET_SUPPORTED_CPUID,c); ioctl(v,KVM_SET_CPUID2,c);
  struct kvm_sregs s; ioctl(v,KVM_GET_SREGS,&s);
  s.cr3=0x1000; s.cr4=0x20|0x200|0x400; s.cr0=0x80050033; s.efer=0xd01;
  s.gdt.base=0x500; s.gdt.limit=0x27; s.idt.base=0; s.idt.limit=0;
  struct kvm_segment cs={.base=0,.limit=0xffffffff,.selector=cpl?0x1b:0x08,.type=11,.present=1,.dpl=cpl,.db=0,.s=1,.l=1,.g=1};
  struct kvm_segment ds={.base=0,.limit=0xffffffff,.selector=cpl?0x23:0x10,.type=3,.present=1,.dpl=cpl,.db=1,.s=1,.l=0,.g=1};
  s.cs=cs; s.ds=s.es=s.fs=s.gs=s.ss=ds;
  if(ioctl(v,KVM_SET_SREGS,&s)<0){perror("sregs");return 1;}
  struct kvm_regs g={0}; g.rip=0x10000; g.rsp=0x8000; g.rflags=0x202; ioctl(v,KVM_SET_REGS,&g);
  for(int i=0;i<12;i++){
    alarm(2);
    if(ioctl(v,KVM_RUN,0)<0){ int e=errno; ioctl(v,KVM_GET_REGS,&g);
      printf("KVM_RUN %s after 2 s: rip=%#llx rax=%#llx rflags=%#llx; code bytes at hypercall 1:",strerror(e),g.rip,g.rax,g.rflags);
      for(int k=0x13;k<0x1a;k++) printf(" %02x",m[0x10000+k]); printf("\n"); return 1;}
    ioctl(v,KVM_GET_REGS,&g);
    printf("exit %d rip=%#llx",run->exit_reason,g.rip);
    if(run->exit_reason==KVM_EXIT_MMIO){unsigned d; memcpy(&d,run->mmio.data,4);
      printf(" mmio %s gpa=%#llx data=%#010x '%.4s'",run->mmio.is_write?"write":"read",run->mmio.phys_addr,d,(char*)run->mmio.data);}
    if(run->exit_reason==KVM_EXIT_INTERNAL_ERROR) printf(" internal suberror=%u",run->internal.suberror);
    printf("\n");
    if(run->exit_reason!=KVM_EXIT_MMIO && run->exit_reason!=KVM_EXIT_HLT) break;
  }
  return 0;}
