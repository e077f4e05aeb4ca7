// What one process-wide sequence number costs when T threads take it at once (every traced call
// takes one), beside a per-thread counter and rdtsc alone, with WORK spins of other work between
// takes. Prints ns per operation per thread.  gcc -O2 -pthread seq_contention.c; ./a.out T WORK
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>
static _Atomic unsigned long shared_seq;
static long N = 2000000;
static int mode, work;
struct __attribute__((aligned(64))) own { _Atomic unsigned long v; };
static struct own owns[64];
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static void *run(void *arg){
  long id=(long)arg; volatile unsigned long sink=0;
  for(long i=0;i<N;i++){
    if(mode==0) sink+=atomic_fetch_add(&shared_seq,1);
    else if(mode==1) sink+=atomic_fetch_add(&owns[id].v,1);
    else sink+=__rdtsc();
    for(int k=0;k<work;k++) __asm__ volatile("");
  }
  return 0;
}
int main(int argc,char**argv){
  int T=argc>1?atoi(argv[1]):8; work=argc>2?atoi(argv[2]):0;
  const char*names[]={"shared fetch_add","own fetch_add","rdtsc"};
  for(mode=0;mode<3;mode++){
    pthread_t th[64]; double t0=now();
    for(long i=0;i<T;i++) pthread_create(&th[i],0,run,(void*)i);
    for(int i=0;i<T;i++) pthread_join(th[i],0);
    double ns=(now()-t0)/N;
    printf("threads=%d work=%d op=\"%s\" ns_per_op_per_thread=%.1f\n",T,work,names[mode],ns);
  }
}
