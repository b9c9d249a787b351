// The engine's settings: one object per engine, built by engineSettingsFrom when it is created
// (EngineOptions over the LLMTS_* environment), so a test or an application turns a knob off by
// passing it, never by editing the environment.
import type { Env } from '../backends/common/env.ts';
import { type Knobs, settingsFrom, switchKnob } from '../backends/common/knobs.ts';

export interface EngineSettings {
  /**
   * Enqueue decode steps one ahead of reading their tokens back ($LLMTS_PIPELINE, on by default):
   * steps of greedy rows, and of device-sampled rows without penalties or grammar (pipeline.ts);
   * needs a backend with a device argmax. Off: every step is read back before the next is built.
   */
  readonly pipeline: boolean;
  /**
   * Sample non-greedy rows on the device (Backend.sampleRows) instead of reading their logits back
   * ($LLMTS_DEVICE_SAMPLING, on by default where the backend has the op). Off: the host samples.
   */
  readonly deviceSampling: boolean;
  /**
   * Replay decode-only steps from captured graphs where the backend captures them ($LLMTS_GRAPHS,
   * on by default; models/decode-graphs.ts). Off: every step runs op by op.
   */
  readonly graphs: boolean;
}

const ENGINE_KNOBS: Knobs<EngineSettings> = {
  pipeline: switchKnob('LLMTS_PIPELINE', true),
  deviceSampling: switchKnob('LLMTS_DEVICE_SAMPLING', true),
  graphs: switchKnob('LLMTS_GRAPHS', true),
};

/** The engine's settings: `overrides` where given (checked), the rest from `env`. */
export function engineSettingsFrom(env: Env, overrides: Partial<EngineSettings> = {}): EngineSettings {
  return settingsFrom(ENGINE_KNOBS, env, overrides);
}
