// The fit planner (`llmts fit`, and the server's KV sizing): see plan.ts.
export { FitPlanner, FitError, KV_DTYPES, DEFAULT_CHUNK, DEFAULT_BLOCK_SIZE } from './plan.ts';
export type { FitPlan, FitRequest, KvDtype, KvGroupReport, WeightsReport, StepShape, PlannerSource } from './plan.ts';
export { GPUS, GPU_NAMES, MachineError, gpuMachine, customMachine, cpuMachine, measureCopyBandwidth } from './machines.ts';
export type { Machine, MachineKind } from './machines.ts';
export { DEFAULT_GPU_MEMORY_UTILIZATION } from './constants.ts';
export { planServeKv, KvBudgetError } from './serve-plan.ts';
export type { ServeKvPlan, ServeKvRequest, SpeculationMemory } from './serve-plan.ts';
export { planDrafter, safetensorsBytes, type DrafterPlan, type DrafterInfo } from './drafter.ts';
