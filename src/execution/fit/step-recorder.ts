// What the planner replays (FitPlanner.simulatePool) is the step shapes an engine really ran. The
// benches and tests that check the planner against a run record them here, where every step
// enters the model.

import type { DecoderModel, PendingStep } from '../../models/decoder.ts';
import type { StepShape } from './plan.ts';

/**
 * Wraps `model.launch` (the engine hands it every step) so each step is appended, as a StepShape,
 * to the returned list; `onLaunch` sees each step once it is enqueued (its ops allocated).
 */
export function recordStepShapes(model: DecoderModel, blockSize: number, onLaunch?: (step: PendingStep) => void): StepShape[] {
  const steps: StepShape[] = [];
  const launch = model.launch.bind(model);
  model.launch = ((batch, kv, picks, keep) => {
    steps.push({
      tokens: batch.tokens.length, rows: batch.rows.length, sampled: batch.logitTokens.length,
      tableBlocks: Math.max(...batch.rows.map((r) => Math.ceil((r.start + r.count) / blockSize))),
    });
    const out = launch(batch, kv, picks, keep);
    onLaunch?.(out);
    return out;
  }) as typeof model.launch;
  return steps;
}
