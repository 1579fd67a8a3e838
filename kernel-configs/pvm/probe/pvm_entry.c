/* Issue 17 feasibility probe (Shoal, our own code). Build: gcc -O1 -o /tmp/synth synth.c
 * Run: /tmp/synth 3   (guest code at CPL 3, IF=1: how upstream PVM enters a PVM guest kernel)
 *      /tmp/synth 0   (guest code at CPL 0: how this host's native mode runs a stock kernel)
 * The guest runs upstream PVM's boot-time detection, PVM_SYNTHETIC_CPUID
 * (invlpg 0xffffffffff4d5650; cpuid with eax=0x40000000), then stores eax/ebx/ecx/edx
 * to an unbacked address (each store is one KVM_EXIT_MMIO), then tries
 * wrmsr(MSR_PVM_VCPU_STRUCT=0x4b564df1). No IDT: any fault ends in a shutdown exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <linux/kvm.h>
int main(int argc,char**argv){
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
    0xb8,0x00,0x00,0x00,0x40,                         /* mov eax,0x40000000 */
    0x31,0xc9,                                        /* xor ecx,ecx */
    0x0f,0x01,0x3c,0x25,0x50,0x56,0x4d,0xff,0x0f,0xa2,/* PVM_SYNTHETIC_CPUID */
    0x89,0x04,0x25,0x00,0x00,0x20,0x00,               /* mov [0x200000],eax */
    0x89,0x1c,0x25,0x04,0x00,0x20,0x00,               /* mov [0x200004],ebx */
    0x89,0x0c,0x25,0x08,0x00,0x20,0x00,               /* mov [0x200008],ecx */
    0x89,0x14,0x25,0x0c,0x00,0x20,0x00,               /* mov [0x20000c],edx */
    0xb9,0xf1,0x4d,0x56,0x4b,0x31,0xc0,0x31,0xd2,0x0f,0x30, /* wrmsr 0x4b564df1 <- 0 */
    0xc7,0x04,0x25,0x10,0x00,0x20,0x00,0x4b,0x4f,0x4f,0x4b, /* mov dword [0x200010],'KOOK' */
    0xeb,0xfe};
  memcpy(m+0x10000,code,sizeof code);
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
    if(ioctl(v,KVM_RUN,0)<0){perror("run");return 1;}
    ioctl(v,KVM_GET_REGS,&g);
    printf("exit %d rip=%#llx",run->exit_reason,g.rip);
    if(run->exit_reason==KVM_EXIT_MMIO){unsigned d; memcpy(&d,run->mmio.data,4);
      printf(" mmio %s gpa=%#llx data=%#010x '%.4s'",run->mmio.is_write?"write":"read",run->mmio.phys_addr,d,(char*)run->mmio.data);}
    if(run->exit_reason==KVM_EXIT_INTERNAL_ERROR) printf(" internal suberror=%u",run->internal.suberror);
    printf("\n");
    if(run->exit_reason!=KVM_EXIT_MMIO) break;
  }
  return 0;}
