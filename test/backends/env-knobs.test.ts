// The LLMTS_* knobs' parser (backends/common/env.ts): unset or empty means the default, anything
// outside the allowed values stops with a line that names the variable, what it allows and what it
// got; and each module that reads a knob at load time refuses a bad value when loaded in a child
// process (the way a user meets it: at startup).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, it } from 'node:test';

import { envChoice, envInt, envNumber, envSwitch } from '../../src/backends/common/env.ts';
import { cpuBf16Dot, gemvParallelMinBytes } from '../../src/backends/cpu/cpu-knobs.ts';

describe('LLMTS_* knobs (envInt, envNumber, envChoice, envSwitch)', () => {
  it('integers: the default when unset or empty; range, step and form checked', () => {
    const r = { min: 16, max: 4096, multipleOf: 16 };
    assert.equal(envInt('K', 64, r, {}), 64);
    assert.equal(envInt('K', 64, r, { K: '' }), 64);
    assert.equal(envInt('K', 64, r, { K: '  ' }), 64);
    assert.equal(envInt('K', 64, r, { K: ' 32 ' }), 32);
    assert.equal(envInt('K', 64, { min: 0, max: 8 }, { K: '0' }), 0);
    for (const bad of ['8', '4112', '24', '32.0', '0x20', '1e2', 'abc', '-16']) {
      assert.throws(() => envInt('K', 64, r, { K: bad }), new RegExp(`^Error: K must be a multiple of 16 from 16 to 4096, got "${bad}"$`));
    }
    assert.throws(() => envInt('N', 3, { min: 1, max: 32 }, { N: '2.5' }), /^Error: N must be an integer from 1 to 32, got "2.5"$/);
  });

  it('numbers: finite, in range', () => {
    assert.equal(envNumber('M', 1.1, { min: 1, max: 4 }, {}), 1.1);
    assert.equal(envNumber('M', 1.1, { min: 1, max: 4 }, { M: '1.25' }), 1.25);
    for (const bad of ['0.9', '5', 'NaN', 'Infinity', 'x']) {
      assert.throws(() => envNumber('M', 1.1, { min: 1, max: 4 }, { M: bad }), /^Error: M must be a number from 1 to 4, got /);
    }
  });

  it('choices: the first is the default; anything else listed is refused', () => {
    assert.equal(envChoice('C', ['tc', 'cuda-core'], {}), 'tc');
    assert.equal(envChoice('C', ['tc', 'cuda-core'], { C: 'cuda-core' }), 'cuda-core');
    assert.throws(() => envChoice('C', ['tc', 'cuda-core'], { C: 'cuda_core' }), /^Error: C must be "tc" or "cuda-core", got "cuda_core"$/);
    assert.equal(envSwitch('S', true, {}), true);
    assert.equal(envSwitch('S', true, { S: 'off' }), false);
    assert.equal(envSwitch('S', false, {}), false);
    assert.equal(envSwitch('S', false, { S: 'on' }), true);
    assert.throws(() => envSwitch('S', true, { S: 'of' }), /^Error: S must be "on" or "off", got "of"$/);
    assert.throws(() => envSwitch('S', true, { S: '0' }), /must be "on" or "off"/);
  });

  it('modules that read a knob at load refuse a bad value at startup (a child process each)', () => {
    const cases: [string, string, string, RegExp][] = [
      ['src/backends/cuda/attention.ts', 'LLMTS_CUDA_ATT_TC_RESIDENT', 'three', /LLMTS_CUDA_ATT_TC_RESIDENT must be an integer from 1 to 32, got "three"/],
      ['src/backends/cuda/cuda-fused-ops.ts', 'LLMTS_CUDA_FUSE_NORM', 'no', /LLMTS_CUDA_FUSE_NORM must be "on" or "off", got "no"/],
      ['src/backends/cuda/gemm-tuning.ts', 'LLMTS_CUDA_GEMV_MARGIN', '0.5', /LLMTS_CUDA_GEMV_MARGIN must be a number from 1 to 4, got "0.5"/],
      ['src/backends/cuda/attention-kernels.ts', 'LLMTS_CUDA_ATT_TC_GRID', 'heads', /LLMTS_CUDA_ATT_TC_GRID must be "heads-first" or "slots-first", got "heads"/],
      ['src/backends/cuda/moe-kernels.ts', 'LLMTS_CUDA_MOE_PASS_ROWS', '8', /LLMTS_CUDA_MOE_PASS_ROWS must be an integer from 16 to 65536, got "8"/],
    ];
    for (const [module, name, value, want] of cases) {
      const run = spawnSync(process.execPath, ['--import', 'tsx', '-e', `await import(${JSON.stringify(`./${module}`)})`], {
        env: { ...process.env, [name]: value }, encoding: 'utf8',
      });
      assert.notEqual(run.status, 0, `${module} with ${name}=${value} loaded`);
      assert.match(run.stderr, want, `${module}: ${run.stderr.slice(0, 400)}`);
    }
  });

  it('LLMTS_CPU_BF16_DOT (read by the native library itself): on by default, off caps the kernels at AVX-512\'s f32 ones', () => {
    assert.equal(cpuBf16Dot({}), true);
    assert.equal(cpuBf16Dot({ LLMTS_CPU_BF16_DOT: 'off' }), false);
    assert.throws(() => cpuBf16Dot({ LLMTS_CPU_BF16_DOT: 'no' }), /LLMTS_CPU_BF16_DOT must be "on" or "off", got "no"/);
    const best = (value: string) => spawnSync(process.execPath, ['--import', 'tsx', '-e',
      `const { loadNativeLib } = await import('./src/backends/cpu/native-lib.ts'); console.log(loadNativeLib().setIsa(-1));`], {
      env: { ...process.env, LLMTS_CPU_BF16_DOT: value }, encoding: 'utf8',
    });
    const off = best('off');
    assert.equal(off.status, 0, off.stderr);
    assert.ok(Number(off.stdout.trim()) <= 2, `with LLMTS_CPU_BF16_DOT=off the best ISA is ${off.stdout.trim()} (3 is AVX512-BF16)`);
    const bad = best('0');
    assert.notEqual(bad.status, 0, 'the library loaded with LLMTS_CPU_BF16_DOT=0');
    assert.match(bad.stderr, /LLMTS_CPU_BF16_DOT must be "on" or "off", got "0"/);
  });

  it('LLMTS_GEMV_PAR_MIN_BYTES (read by the native library itself) is checked when the CPU backend loads it', () => {
    assert.equal(gemvParallelMinBytes({}), 2 ** 20);
    assert.equal(gemvParallelMinBytes({ LLMTS_GEMV_PAR_MIN_BYTES: ' 4096 ' }), 4096);
    assert.equal(gemvParallelMinBytes({ LLMTS_GEMV_PAR_MIN_BYTES: '   ' }), 2 ** 20, 'blanks: unset, as the C side reads them');
    for (const bad of ['abc', '1e6', '-1', '4k']) {
      assert.throws(() => gemvParallelMinBytes({ LLMTS_GEMV_PAR_MIN_BYTES: bad }), /LLMTS_GEMV_PAR_MIN_BYTES must be an integer from 0 to/, bad);
    }
    const run = spawnSync(process.execPath, ['--import', 'tsx', '-e',
      `const { createCpuBackend } = await import('./src/backends/cpu/index.ts'); await createCpuBackend();`], {
      env: { ...process.env, LLMTS_GEMV_PAR_MIN_BYTES: 'abc' }, encoding: 'utf8',
    });
    assert.notEqual(run.status, 0, 'the CPU backend started with LLMTS_GEMV_PAR_MIN_BYTES=abc');
    assert.match(run.stderr, /LLMTS_GEMV_PAR_MIN_BYTES must be an integer from 0 to \d+, got "abc"/);
  });
});
