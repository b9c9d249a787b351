// Recording a request's events through Engine.submit, for the engine tests that compare runs.
import type { Engine } from '../../src/execution/engine.ts';
import type { EngineRequest, SequenceEvent } from '../../src/execution/sequence.ts';

/** Every event of a request, up to its finish. */
export function record(e: Engine, req: EngineRequest, signal?: AbortSignal, onEvent?: (ev: SequenceEvent) => void): Promise<SequenceEvent[]> {
  return new Promise((resolve) => {
    const events: SequenceEvent[] = [];
    e.submit(req, (ev) => {
      events.push(ev);
      onEvent?.(ev);
      if (ev.type === 'finish') resolve(events);
    }, signal);
  });
}

/** The token ids of a request's events, in order. */
export const tokensOf = (events: SequenceEvent[]) => events.flatMap((ev) => (ev.type === 'token' ? [ev.tokenId] : []));
