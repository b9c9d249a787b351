// Seeded pseudo-random numbers, one generator per request.
//
// Generator: xoshiro128** 1.1 (Blackman & Vigna, https://prng.di.unimi.it/xoshiro128starstar.c),
// 128-bit state, period 2^128 - 1; chosen because it needs only 32-bit integer ops (Math.imul,
// shifts), which V8 runs without BigInt or float tricks.
// Seeding: the seed (any safe integer, negative ones taken as 64-bit two's complement) is
// expanded with splitmix64, as the xoshiro authors recommend, so that nearby seeds (0, 1, 2...)
// give unrelated streams: state words = [lo(sm1), hi(sm1), lo(sm2), hi(sm2)] of the first two
// splitmix64 outputs. BigInt is used only here, once per request.
// Without a seed the 128-bit state comes from crypto.getRandomValues.

import { webcrypto } from 'node:crypto';

const MASK64 = (1n << 64n) - 1n;

/** splitmix64 (https://prng.di.unimi.it/splitmix64.c) as a closure over its 64-bit state. */
function splitmix64(seed: bigint): () => bigint {
  let x = seed & MASK64;
  return () => {
    x = (x + 0x9e3779b97f4a7c15n) & MASK64;
    let z = x;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
    return z ^ (z >> 31n);
  };
}

export class Xoshiro128StarStar {
  // Invariant: not all four words are zero (the all-zero state is a fixed point).
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;

  /** Seeds from the four 32-bit words directly (tests, crypto seeding). */
  constructor(s0: number, s1: number, s2: number, s3: number) {
    this.s0 = s0 >>> 0;
    this.s1 = s1 >>> 0;
    this.s2 = s2 >>> 0;
    this.s3 = s3 >>> 0;
    if ((this.s0 | this.s1 | this.s2 | this.s3) === 0) this.s0 = 1;
  }

  /** The documented seeding: splitmix64 expansion of a safe-integer (or bigint) seed. */
  static fromSeed(seed: number | bigint): Xoshiro128StarStar {
    if (typeof seed === 'number' && !Number.isSafeInteger(seed)) {
      throw new RangeError(`seed must be a safe integer, got ${seed}`);
    }
    const next = splitmix64(BigInt.asUintN(64, BigInt(seed)));
    const a = next();
    const b = next();
    return new Xoshiro128StarStar(Number(a & 0xffffffffn), Number(a >> 32n), Number(b & 0xffffffffn), Number(b >> 32n));
  }

  /** Unpredictable seeding for requests without a seed. */
  static fromCrypto(): Xoshiro128StarStar {
    const w = webcrypto.getRandomValues(new Uint32Array(4));
    return new Xoshiro128StarStar(w[0]!, w[1]!, w[2]!, w[3]!);
  }

  /** Next 32-bit output as an unsigned integer. */
  nextUint32(): number {
    const s1 = this.s1;
    const r = Math.imul(rotl(Math.imul(s1, 5), 7), 9);
    const t = s1 << 9;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    return r >>> 0;
  }

  /** Uniform double in [0, 1) with 53 random bits (27 + 26 bits of two outputs). */
  nextFloat64(): number {
    const a = this.nextUint32() >>> 5;
    const b = this.nextUint32() >>> 6;
    return (a * 67108864 + b) / 9007199254740992;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/** The generator a request uses: seeded when a seed is given, crypto-seeded otherwise. */
export function createRng(seed?: number | bigint): Xoshiro128StarStar {
  return seed === undefined ? Xoshiro128StarStar.fromCrypto() : Xoshiro128StarStar.fromSeed(seed);
}
