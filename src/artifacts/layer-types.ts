// Which layers are full-attention and which slide, and how wide the window is, per family
// (see WindowRule in families.ts). Explicit layer_types win over every pattern in the families
// whose transformers model reads them.

import { ArtifactError } from './errors.ts';
import type { Family } from './families.ts';
import type { LayerTypeName } from './rope-config.ts';

export interface LayerKind {
  /** selects the rope (gemma3) and, with window, the attention of the layer */
  type: LayerTypeName;
  /** 0 = full causal attention; W = keys p-W+1 .. p (transformers: kv_idx > q_idx - W) */
  window: number;
}

type Dict = Record<string, any>;

export function layerKinds(c: Dict, family: Family, modelType: string, numLayers: number, file: string): LayerKind[] {
  const sw = slidingWindowOf(c, family, file);
  const range = Array.from({ length: numLayers }, (_, i) => i);
  const uniform = (window: number): LayerKind[] => range.map(() => ({ type: 'full_attention', window }));
  const typed = (types: LayerTypeName[], window: number): LayerKind[] =>
    types.map((type) => ({ type, window: type === 'sliding_attention' ? window : 0 }));

  switch (family.windowRule) {
    case 'none':
      return uniform(0);
    case 'all':
      // transformers' AutoConfig loads a mistral config with layer_types as ministral, which honours them
      if (modelType === 'mistral' && c.layer_types != null) return typed(explicitTypes(c, numLayers, file), sw ?? 0);
      return uniform(sw ?? 0);
    case 'all_if_used':
      return uniform(c.use_sliding_window ? (sw ?? 0) : 0);
    case 'qwen': {
      // the window exists only with use_sliding_window; without it "sliding" layers attend fully
      const window = c.use_sliding_window ? sw : null;
      const maxWindowLayers: number = c.max_window_layers ?? 28;
      const types = c.layer_types != null
        ? explicitTypes(c, numLayers, file)
        : range.map((i): LayerTypeName => (window != null && i >= maxWindowLayers ? 'sliding_attention' : 'full_attention'));
      return typed(types, window ?? 0);
    }
    case 'alternate': {
      const types = c.layer_types != null
        ? explicitTypes(c, numLayers, file)
        : range.map((i): LayerTypeName => ((i + 1) % 2 ? 'sliding_attention' : 'full_attention'));
      return typed(types, sw ?? 0);
    }
    case 'pattern': {
      const pattern: number = c.sliding_window_pattern ?? c._sliding_window_pattern ?? 6;
      const types = c.layer_types != null
        ? explicitTypes(c, numLayers, file)
        : range.map((i): LayerTypeName => ((i + 1) % pattern ? 'sliding_attention' : 'full_attention'));
      return typed(types, sw ?? 0);
    }
  }
}

/** sliding_window: the family default when the key is absent; null / 0 mean no window */
function slidingWindowOf(c: Dict, family: Family, file: string): number | null {
  const v = 'sliding_window' in c ? c.sliding_window : family.slidingWindow;
  if (v === undefined || v === null || v === 0) return null;
  if (!Number.isInteger(v) || v < 0) {
    throw new ArtifactError(`sliding_window must be a positive integer, got ${JSON.stringify(v)} in ${file}`, file);
  }
  return v;
}

function explicitTypes(c: Dict, numLayers: number, file: string): LayerTypeName[] {
  const lt = c.layer_types;
  if (!Array.isArray(lt) || lt.length !== numLayers) {
    throw new ArtifactError(
      `layer_types must list one entry per layer (${numLayers}), got ${JSON.stringify(lt)?.slice(0, 80)} in ${file}`,
      file,
    );
  }
  for (const t of lt) {
    // an unknown layer kind is an error, never silently treated as full attention
    if (t !== 'full_attention' && t !== 'sliding_attention') {
      throw new ArtifactError(
        `layer_types entry "${t}" is not supported (full_attention, sliding_attention) in ${file}`,
        file,
      );
    }
  }
  return lt;
}
