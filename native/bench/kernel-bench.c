// Kernel bench without Node (e.g. a GPU host that has no Node.js): drives the library through its
// exported queue API and prints matmul GFLOP/s and GB/s at decode and prefill shapes, a stream
// (elementwise add) ceiling, and paged attention at decode (4k context), a 512-token prefill and a
// 1k-token prefill at the demo model's shape.
//
//   gcc -std=gnu11 -O3 -fopenmp -fno-math-errno -Wno-psabi native/bench/kernel-bench.c native/*.c -lm \
//       -o build/kernel-bench && OMP_WAIT_POLICY=passive build/kernel-bench
//   build/kernel-bench panels [N K]...   # bf16 weights row-major against panels (DT_BF16_P16)
//   OMP_NUM_THREADS=1 build/kernel-bench quant [N K]...   # bf16 panels against Q8_0 / Q4_0 / Q4_K / Q6_K panels
//   build/kernel-bench attention   # the attention cases only (decode with f32, bf16, int8 and fp8 pools)
//
// Note: weights of 32-235 MB fit a large L3 (300 MB on the Xeon measured): read "% of stream"
// as cache-resident there.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include <omp.h>
int llm_init(void); int64_t llm_alloc(int64_t); int64_t llm_fence(void); int64_t llm_wait(int64_t);
int llm_set_isa(int);
void llm_op_matmul(int64_t,int64_t,int64_t,int64_t,int,int,int,int);
void llm_op_add(int64_t,int64_t,int64_t,int64_t,double);
void llm_op_pack_bf16_p16(int64_t,int64_t,int64_t,int64_t); int64_t llm_p16_bytes(int64_t,int64_t);
void llm_op_write_kv(int64_t kp,int64_t vp,int64_t k,int64_t v,int64_t slots,int64_t T,int64_t rf,int64_t ns,int64_t dt,int64_t D);
void llm_op_attention(int64_t q,int64_t kp,int64_t vp,int64_t row,int64_t pos,int64_t tab,int64_t out,int64_t T,int64_t H,int64_t KVH,int64_t D,int64_t NB,int64_t BS,int64_t R,int64_t MBR,int64_t window,int64_t kv_dt,double scale,double softcap);
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static void sync_(){ llm_wait(llm_fence()); }
static float *rnd(size_t n){ float*p=(float*)(intptr_t)llm_alloc(n*4); for(size_t i=0;i<n;i++) p[i]=(float)((i*2654435761u)%1000)/1000.f-0.5f; return p;}
// `kernel-bench panels [N K]...`: bf16 matmuls with row-major weights against the same weights in
// panels (DT_BF16_P16), at decode and prefill M, the demo model's and Qwen3-0.6B's shapes by default.
static int panels_ab(int argc, char **argv){
  int def[][2]={{384,384},{1024,384},{384,1024},{8192,384},{2048,1024},{1024,1024},{3072,1024},{1024,3072}};
  int ns = argc > 2 ? (argc - 2) / 2 : 8;
  printf("threads %d, isa %d\n", omp_get_max_threads(), llm_set_isa(-1));
  for(int s=0;s<ns;s++){ int N = argc > 2 ? atoi(argv[2+2*s]) : def[s][0], K = argc > 2 ? atoi(argv[3+2*s]) : def[s][1];
    uint16_t*w=(uint16_t*)(intptr_t)llm_alloc((size_t)N*K*2); void*wp=(void*)(intptr_t)llm_alloc(llm_p16_bytes(N,K));
    for(size_t i=0;i<(size_t)N*K;i++) w[i]=0x3c00+(i*7919%512);
    llm_op_pack_bf16_p16((intptr_t)w,(intptr_t)wp,N,K); sync_();
    int Ms[]={1,4,512};
    for(int mi=0;mi<3;mi++){ int M=Ms[mi]; float*x=rnd((size_t)M*K); float*y=rnd((size_t)M*N);
      double ms[2];
      for(int v=0;v<2;v++){ int64_t wa=v?(intptr_t)wp:(intptr_t)w; int dt=v?4:2;
        llm_op_matmul((intptr_t)x,wa,0,(intptr_t)y,M,N,K,dt); sync_();
        int reps = M==1?400:(M<=8?200:8); double best=1e9;
        for(int round=0;round<5;round++){ double t0=now(); for(int r=0;r<reps;r++) llm_op_matmul((intptr_t)x,wa,0,(intptr_t)y,M,N,K,dt); sync_();
          double t=(now()-t0)/reps*1e3; if(t<best) best=t; }
        ms[v]=best; }
      printf("bf16 M=%-4d N=%-5d K=%-5d rows %8.4f ms  panels %8.4f ms  panels/rows time %.3f\n", M,N,K, ms[0], ms[1], ms[1]/ms[0]);
      free(x); free(y);
    }
  }
  return 0;
}

// `kernel-bench quant [N K]...`: the same matrix as bf16 panels (DT_BF16_P16), Q8_0 panels
// (DT_Q8_0_P16), Q4_0 panels of nibbles (DT_Q4_0_P16), and Q4_0's values unpacked into Q8_0 panels
// at load (the layout Q4_0 would have without nibbles), Q4_K, Q6_K, Q5_K and IQ4_XS panels (DT_Q4_K_P16,
// DT_Q6_K_P16, DT_Q5_K_P16, DT_IQ4_XS_P16; K a multiple of 256), at M = 1, 4 and 512; Qwen3-0.6B's shapes by
// default. Times are process CPU time (CLOCK_PROCESS_CPUTIME_ID: run with OMP_NUM_THREADS=1, other
// work on a shared machine then costs wall time, not these figures); decode cycles through copies
// of the weights filling 256 MiB of bf16, so each matmul streams its weights from memory.
void llm_op_pack_quant(int64_t,int64_t,int64_t,int64_t,int); int64_t llm_quant_p16_bytes(int64_t,int64_t,int);
int llm_quant_vnni(void);
static double cpu_now(){struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static uint16_t f32_to_f16_bits(float f){ // small normal values only (the bench's scales)
  uint32_t u; memcpy(&u,&f,4); uint32_t sgn=(u>>16)&0x8000; int e=(int)((u>>23)&0xff)-127+15; uint32_t m=(u>>13)&0x3ff;
  return (uint16_t)(sgn|((uint32_t)e<<10)|m); }
static int quant_ab(int argc, char **argv){
  int def[][2]={{2048,1024},{1024,1024},{1024,2048},{3072,1024},{1024,3072},{151936,1024}};
  int ns = argc > 2 ? (argc - 2) / 2 : 6;
  printf("threads %d, isa %d, vnni %d; ms of process CPU time a matmul (best of 5), decode GB/s of the weights' bytes\n",
         omp_get_max_threads(), llm_set_isa(-1), llm_quant_vnni());
  for(int s=0;s<ns;s++){ int N = argc > 2 ? atoi(argv[2+2*s]) : def[s][0], K = argc > 2 ? atoi(argv[3+2*s]) : def[s][1];
    enum{NVAR=8}; const int nvar = K%256==0 ? NVAR : 4;
    const size_t nb=(size_t)N*K/32, ns=(size_t)N*K/256;
    const char*names[NVAR]={"bf16 panels","Q8_0","Q4_0 nibbles","Q4_0 as int8","Q4_K","Q6_K","Q5_K","IQ4_XS"};
    int dts[NVAR]={4,5,6,5,7,8,11,12}; size_t wb[NVAR]={llm_p16_bytes(N,K),llm_quant_p16_bytes(N,K,5),llm_quant_p16_bytes(N,K,6),llm_quant_p16_bytes(N,K,5),
      nvar>4?llm_quant_p16_bytes(N,K,7):0,nvar>4?llm_quant_p16_bytes(N,K,8):0,nvar>4?llm_quant_p16_bytes(N,K,11):0,nvar>4?llm_quant_p16_bytes(N,K,12):0};
    int copies=(int)((256u<<20)/((size_t)N*K*2)); if(copies<1) copies=1; if(copies>64) copies=64;
    void*ws[NVAR][64];
    uint8_t*q8=malloc(nb*34),*q4=malloc(nb*18),*q4as8=malloc(nb*34),*q4k=malloc(ns*144),*q6k=malloc(ns*210),*q5k=malloc(ns*176),*iq4=malloc(ns*136);
    uint16_t*bf=malloc((size_t)N*K*2);
    for(size_t b=0;b<ns*176;b++) q5k[b]=(uint8_t)((b*2654435761u)>>11);
    for(size_t b=0;b<ns*136;b++) iq4[b]=(uint8_t)((b*2246822519u)>>11);
    for(size_t b=0;b<ns*144;b++) q4k[b]=(uint8_t)((b*2654435761u)>>13); // any scales, mins and nibbles
    for(size_t b=0;b<ns*210;b++) q6k[b]=(uint8_t)((b*2246822519u)>>13);
    for(size_t b=0;b<ns;b++){ uint16_t d=f32_to_f16_bits(0.0005f), m=f32_to_f16_bits(0.0002f);
      memcpy(q4k+b*144,&d,2); memcpy(q4k+b*144+2,&m,2); memcpy(q6k+b*210+208,&d,2);
      memcpy(q5k+b*176,&d,2); memcpy(q5k+b*176+2,&m,2); memcpy(iq4+b*136,&d,2); }
    for(size_t b=0;b<nb;b++){ uint16_t d=f32_to_f16_bits(0.01f+0.001f*(float)(b%7));
      memcpy(q8+b*34,&d,2); memcpy(q4+b*18,&d,2); memcpy(q4as8+b*34,&d,2);
      for(int j=0;j<32;j++) q8[b*34+2+j]=(uint8_t)((b*31+j*7919)%255);
      for(int j=0;j<16;j++) q4[b*18+2+j]=(uint8_t)((b*17+j*131)%256);
      for(int j=0;j<32;j++){ int u=j<16?(q4[b*18+2+j]&15):(q4[b*18+2+j-16]>>4); q4as8[b*34+2+j]=(uint8_t)(int8_t)(u-8); } }
    for(size_t i=0;i<(size_t)N*K;i++) bf[i]=0x3c00+(i*7919%512);
    for(int v=0;v<nvar;v++) for(int c=0;c<copies;c++){
      ws[v][c]=(void*)(intptr_t)llm_alloc((int64_t)wb[v]);
      void*srcs[NVAR]={bf,q8,q4,q4as8,q4k,q6k,q5k,iq4}; void*src=srcs[v];
      const size_t sbs[NVAR]={(size_t)N*K*2,nb*34,nb*18,nb*34,ns*144,ns*210,ns*176,ns*136}; size_t sb=sbs[v];
      void*st=(void*)(intptr_t)llm_alloc((int64_t)sb); memcpy(st,src,sb);
      if(v==0) llm_op_pack_bf16_p16((intptr_t)st,(intptr_t)ws[v][c],N,K); else llm_op_pack_quant((intptr_t)st,(intptr_t)ws[v][c],N,K,dts[v]);
      sync_(); free(st); }
    int Ms[]={1,4,512};
    for(int mi=0;mi<3;mi++){ int M=Ms[mi]; if(M==512 && N>16384) continue; float*x=rnd((size_t)M*K); float*y=rnd((size_t)M*N);
      double ms[NVAR];
      for(int v=0;v<nvar;v++){ int cs = M==512?1:copies; int reps = M==512?2:cs*(M==1?4:2);
        llm_op_matmul((intptr_t)x,(intptr_t)ws[v][0],0,(intptr_t)y,M,N,K,dts[v]); sync_();
        double best=1e9;
        for(int round=0;round<5;round++){ double t0=cpu_now();
          for(int r=0;r<reps;r++){ llm_op_matmul((intptr_t)x,(intptr_t)ws[v][r%cs],0,(intptr_t)y,M,N,K,dts[v]); }
          sync_(); double t=(cpu_now()-t0)/reps*1e3; if(t<best) best=t; }
        ms[v]=best; }
      printf("M=%-4d N=%-6d K=%-5d", M,N,K);
      for(int v=0;v<nvar;v++){ if(M==1) printf("  %s %.4f ms %.1f GB/s", names[v], ms[v], wb[v]/(ms[v]*1e6)); else printf("  %s %.4f ms", names[v], ms[v]); }
      printf("\n"); free(x); free(y);
    }
    for(int v=0;v<nvar;v++) for(int c=0;c<copies;c++) free(ws[v][c]);
    free(q8); free(q4); free(q4as8); free(q4k); free(q6k); free(q5k); free(iq4); free(bf);
  }
  return 0;
}

int main(int argc,char**argv){
  llm_init();
  if (argc > 1 && strcmp(argv[1], "panels") == 0) return panels_ab(argc, argv);
  if (argc > 1 && strcmp(argv[1], "quant") == 0) return quant_ab(argc, argv);
  printf("threads %d, isa %d\n", omp_get_max_threads(), llm_set_isa(-1));
  const int attention_only = argc > 1 && strcmp(argv[1], "attention") == 0;
  double t0;
  if (!attention_only) {
  size_t n=32u<<20; float*a=rnd(n),*c=rnd(n),*o=rnd(n);
  llm_op_add((intptr_t)a,(intptr_t)c,(intptr_t)o,n,1); sync_();
  t0=now(); for(int r=0;r<5;r++) llm_op_add((intptr_t)a,(intptr_t)c,(intptr_t)o,n,1); sync_();
  double ceil_=12.0*n/((now()-t0)/5)/1e9; printf("stream add: %.1f GB/s\n", ceil_);
  int shapes[][2]={{4096,4096},{14336,4096}};
  for(int s=0;s<2;s++){ int N=shapes[s][0],K=shapes[s][1];
    for(int dt=0;dt<3;dt+=2){ size_t esz=dt?2:4; uint16_t*w=(uint16_t*)(intptr_t)llm_alloc((size_t)N*K*4);
      for(size_t i=0;i<(size_t)N*K*2;i++) w[i]=0x3c00+(i*7919%512);
      int Ms[]={1,2,4,5,8,9,16,128,512}; int nMs=9;
      for(int mi=0;mi<nMs;mi++){ int M=Ms[mi]; float*x=rnd((size_t)M*K); float*y=rnd((size_t)M*N);
        llm_op_matmul((intptr_t)x,(intptr_t)w,0,(intptr_t)y,M,N,K,dt); sync_();
        int reps = M==1?50:(M<=8?20:(M==128?5:2)); t0=now();
        for(int r=0;r<reps;r++) llm_op_matmul((intptr_t)x,(intptr_t)w,0,(intptr_t)y,M,N,K,dt);
        sync_();
        double ms=(now()-t0)/reps*1e3; double gb=((double)N*K*esz+4.0*M*(N+K))/(ms*1e6);
        printf("matmul %-4s M=%-4d N=%-6d K=%-5d %8.3f ms %8.1f GFLOP/s %6.1f GB/s (%3.0f%% of stream)\n", dt?"bf16":"f32", M,N,K, ms, 2.0*M*N*K/(ms*1e6), gb, 100*gb/ceil_);
        free(x); free(y);
      }
      free(w);
    }
  }
  }
  // attention: decode at 4k context and a 512-token prefill (H=32, KVH=8, D=128), and a 1k-token
  // prefill at the demo model's shape (H=6, KVH=2, D=64); BS=16
  int BS=16;
  // cases 3, 4, 5: case 0's decode with bf16, int8 and fp8 pools (kdt 2, 9, 10: rows widened chunk
  // by chunk; half the KV bytes, and D + 4 bytes a row)
  for(int cse=0;cse<6;cse++){ int T = cse==2?1024:(cse==1?512:1), ctx = cse==2?1024:(cse==1?512:4096); int NB=ctx/BS;
    int H = cse==2?6:32, KVH = cse==2?2:8, D = cse==2?64:128, kdt = cse==3?2:cse==4?9:cse==5?10:0;
    float*kp=rnd((size_t)NB*BS*KVH*D),*vp=rnd((size_t)NB*BS*KVH*D),*q=rnd((size_t)T*H*D),*out=rnd((size_t)T*H*D);
    if(kdt==2){ uint16_t*k16=(uint16_t*)kp,*v16=(uint16_t*)vp; for(size_t e=0;e<(size_t)NB*BS*KVH*D;e++){ uint32_t u; memcpy(&u,kp+e,4); k16[e]=u>>16; memcpy(&u,vp+e,4); v16[e]=u>>16; } }
    if(kdt>=9){ // the pools written by writeKv from the f32 rows
      int n=NB*BS; int32_t*sl=(int32_t*)(intptr_t)llm_alloc((size_t)n*4); for(int i=0;i<n;i++) sl[i]=i;
      float*k8=(float*)(intptr_t)llm_alloc((size_t)n*KVH*(D+4)),*v8=(float*)(intptr_t)llm_alloc((size_t)n*KVH*(D+4));
      llm_op_write_kv((intptr_t)k8,(intptr_t)v8,(intptr_t)kp,(intptr_t)vp,(intptr_t)sl,n,KVH*D,n,kdt,D); sync_();
      kp=k8; vp=v8;
    }
    int32_t*row=(int32_t*)(intptr_t)llm_alloc(T*4),*pos=(int32_t*)(intptr_t)llm_alloc(T*4),*tab=(int32_t*)(intptr_t)llm_alloc(NB*4);
    for(int t=0;t<T;t++){row[t]=0;pos[t]=(cse==0||cse>=3)?ctx-1:t;} for(int b=0;b<NB;b++)tab[b]=b;
    llm_op_attention((intptr_t)q,(intptr_t)kp,(intptr_t)vp,(intptr_t)row,(intptr_t)pos,(intptr_t)tab,(intptr_t)out,T,H,KVH,D,NB,BS,1,NB,0,kdt,0.088,0); sync_();
    int reps=(cse==0||cse>=3)?50:3; t0=now();
    for(int r=0;r<reps;r++) llm_op_attention((intptr_t)q,(intptr_t)kp,(intptr_t)vp,(intptr_t)row,(intptr_t)pos,(intptr_t)tab,(intptr_t)out,T,H,KVH,D,NB,BS,1,NB,0,kdt,0.088,0);
    sync_(); double ms=(now()-t0)/reps*1e3; const int dec = cse==0||cse>=3; double keys = dec? (double)ctx : (double)T*(T+1)/2;
    const double rowb = kdt==2 ? 2.0*D : kdt>=9 ? D+4.0 : 4.0*D;
    printf("attention H=%d KVH=%d D=%d T=%d ctx=%d KV %s: %.3f ms, %.1f GFLOP/s, KV read %.1f GB/s\n", H, KVH, D, T, ctx,
           kdt==2?"bf16":kdt==9?"int8":kdt==10?"fp8":"f32", ms, 4*keys*H*D/(ms*1e6), dec?(double)ctx*KVH*2*rowb/(ms*1e6):0);
  }
  return 0;
}
