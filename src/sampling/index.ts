// Public surface of the sampling layer (imports only contracts/, nothing above).
export * from './params.ts';
export * from './validate.ts';
export * from './prng.ts';
export * from './history.ts';
export * from './penalties.ts';
export * from './select.ts';
export * from './truncation.ts';
export * from './categorical.ts';
export * from './sample-row.ts';
export * from './sampler.ts';
export * from './logprobs.ts';
export * from './device-sampling.ts';
export * from './rejection.ts';
