// The LLMTS_* knobs (backends/common/env.ts parses them, knobs.ts declares them): unset or empty
// means the default, anything outside the allowed values stops with a line that names the variable,
// what it allows and what it got; a value given in code is checked by the same rule. The settings
// objects (CPU, CUDA, engine) are built from them when a backend or engine is created, never when a
// module loads.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, it } from 'node:test';

import { envChoice, envInt, envNumber, envSwitch } from '../../src/backends/common/env.ts';
import { choiceKnob, intKnob, settingsFrom, switchKnob } from '../../src/backends/common/knobs.ts';
import { cpuSettingsFrom } from '../../src/backends/cpu/cpu-settings.ts';
import { createCudaBackend } from '../../src/backends/cuda/index.ts';
import { cudaSettingsFrom } from '../../src/backends/cuda/cuda-settings.ts';
import { engineSettingsFrom } from '../../src/execution/engine-settings.ts';

const cpuBf16Dot = (env: Record<string, string>) => cpuSettingsFrom(env).bf16Dot;
const gemvParallelMinBytes = (env: Record<string, string>) => cpuSettingsFrom(env).gemvParallelMinBytes;

describe('LLMTS_* knobs (envInt, envNumber, envChoice, envSwitch; knobs.ts settingsFrom)', () => {
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

  it('knobs given in code are checked by the same rule, naming the field and the variable', () => {
    const knobs = { n: intKnob('K_N', 3, { min: 1, max: 32 }), on: switchKnob('K_ON', true), c: choiceKnob('K_C', ['a', 'b']) };
    assert.deepEqual(settingsFrom(knobs, {}), { n: 3, on: true, c: 'a' });
    assert.deepEqual(settingsFrom(knobs, { K_N: '7', K_ON: 'off' }, { c: 'b' }), { n: 7, on: false, c: 'b' });
    assert.deepEqual(settingsFrom(knobs, { K_N: '7' }, { n: 9 }), { n: 9, on: true, c: 'a' }, 'code wins over the environment');
    assert.throws(() => settingsFrom(knobs, {}, { n: 40 }, 'g.'), /^Error: g\.n \(\$K_N\) must be an integer from 1 to 32, got 40$/);
    assert.throws(() => settingsFrom(knobs, {}, { c: 'z' as 'a' }), /^Error: c \(\$K_C\) must be "a" or "b", got "z"$/);
    assert.throws(() => settingsFrom(knobs, { K_N: 'x' }), /^Error: K_N must be an integer from 1 to 32, got "x"$/);
    assert.ok(Object.isFrozen(settingsFrom(knobs, {})), 'a settings object never changes once built');
  });

  it('every settings object refuses a bad value when it is built, naming the variable', () => {
    const cases: [(env: Record<string, string>) => unknown, string, string, RegExp][] = [
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_ATT_TC_RESIDENT', 'three', /LLMTS_CUDA_ATT_TC_RESIDENT must be an integer from 1 to 32, got "three"/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_FUSE_NORM', 'no', /LLMTS_CUDA_FUSE_NORM must be "on" or "off", got "no"/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_GEMV_MARGIN', '0.5', /LLMTS_CUDA_GEMV_MARGIN must be a number from 1 to 4, got "0.5"/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_ATT_TC_GRID', 'heads', /LLMTS_CUDA_ATT_TC_GRID must be "heads-first" or "slots-first", got "heads"/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_MOE_PASS_ROWS', '8', /LLMTS_CUDA_MOE_PASS_ROWS must be an integer from 16 to 65536, got "8"/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_MOE_DOWN_ROWS', '2', /LLMTS_CUDA_MOE_DOWN_ROWS must be "4" or "1", got "2"/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_GRAPH_PROFILE', 'on', /LLMTS_CUDA_GRAPH_PROFILE must be "0" or "1", got "on"/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_PROFILER_GRAPHS', '3:0', /LLMTS_CUDA_PROFILER_GRAPHS must be FROM or FROM:COUNT/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_GEMV_DEFINES', 'GEMVP_MINB', /LLMTS_CUDA_GEMV_DEFINES: "GEMVP_MINB" is not NAME=INTEGER/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_ATT_DEFINES', 'A=1,A=2', /LLMTS_CUDA_ATT_DEFINES: A is listed twice/],
      [(env) => cudaSettingsFrom(env), 'LLMTS_CUDA_FUSED_DEFINES', 'A=010', /LLMTS_CUDA_FUSED_DEFINES: "A=010" is not NAME=INTEGER \(decimal\)/],
      [(env) => cpuSettingsFrom(env), 'LLMTS_GEMV_PAR_MIN_BYTES', '1e6', /LLMTS_GEMV_PAR_MIN_BYTES must be an integer from 0 to/],
      [(env) => engineSettingsFrom(env), 'LLMTS_GRAPHS', 'of', /LLMTS_GRAPHS must be "on" or "off", got "of"/],
    ];
    for (const [build, name, value, want] of cases) assert.throws(() => build({ [name]: value }), want, `${name}=${value}`);
  });

  it('no module reads a knob when it loads: every backend module imports with bad values set (a child process)', () => {
    const modules = ['src/backends/cuda/index.ts', 'src/backends/cuda/attention.ts', 'src/backends/cuda/cuda-fused-ops.ts',
      'src/backends/cuda/gemm.ts', 'src/backends/cuda/kernels.ts', 'src/backends/cuda/runtime.ts', 'src/backends/cpu/index.ts',
      'src/execution/engine.ts', 'src/models/decode-graphs.ts'];
    const run = spawnSync(process.execPath, ['--import', 'tsx', '-e',
      `for (const m of ${JSON.stringify(modules.map((m) => `./${m}`))}) await import(m);`], {
      env: { ...process.env, LLMTS_CUDA_ATT_TC_RESIDENT: 'three', LLMTS_CUDA_FUSE_NORM: 'no', LLMTS_CUDA_MOE_PASS_ROWS: '8',
        LLMTS_CUDA_ATT_DEFINES: 'x', LLMTS_CUDA_SLOW_CALL_MS: '-1', LLMTS_PIPELINE: 'maybe', LLMTS_GRAPHS: 'of' },
      encoding: 'utf8',
    });
    assert.equal(run.status, 0, run.stderr.slice(0, 600));
  });

  it('the CUDA backend builds its settings before it looks for a GPU: a bad knob stops it with its name, GPU or not', async () => {
    await assert.rejects(createCudaBackend({ settings: { moe: { passRows: 8 } } }),
      /^Error: moe\.passRows \(\$LLMTS_CUDA_MOE_PASS_ROWS\) must be an integer from 16 to 65536, got 8$/);
    const run = spawnSync(process.execPath, ['--import', 'tsx', '-e',
      `const { createCudaBackend } = await import('./src/backends/cuda/index.ts'); await createCudaBackend();`], {
      env: { ...process.env, LLMTS_CUDA_FUSE_NORM: 'no' }, encoding: 'utf8',
    });
    assert.notEqual(run.status, 0);
    assert.match(run.stderr, /LLMTS_CUDA_FUSE_NORM must be "on" or "off", got "no"/);
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
