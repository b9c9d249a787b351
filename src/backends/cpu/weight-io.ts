// Reading weight bytes from files into native memory (never through the JS heap).
import { constants } from 'node:os';

import { dtypeBytes, type WeightSource } from '../../contracts/backend.ts';
import { DT_CODE, type NativeLib } from './native-lib.ts';

const ERR_EOF = -100000;
const ERR_DTYPE = -100001;

function describeCode(rc: number): string {
  if (rc === ERR_EOF) return 'the file ends before the tensor does';
  if (rc === ERR_DTYPE) return 'unsupported dtype conversion';
  const name = Object.entries(constants.errno).find(([, v]) => v === -rc)?.[0];
  return name ? `${name} (errno ${-rc})` : `error code ${rc}`;
}

/**
 * Reads `nbytes` of `src`'s stored dtype at `fileOffset` into native memory at `dst`, converting
 * to f32 when `toF32`. Runs on a koffi worker thread (overlaps with the command queue).
 */
export function readInto(lib: NativeLib, src: WeightSource, fileOffset: number, nbytes: number, dst: number,
  toF32: boolean): Promise<void> {
  if (src.decode) {
    // values computed on the host (GGUF): the same element range, copied in the dtype asked for
    const esz = dtypeBytes[src.dtype], want = toF32 ? 'f32' : src.dtype;
    const first = (fileOffset - src.offset) / esz, n = nbytes / esz;
    try {
      const all = src.decode(want);
      const part = all.subarray(first * dtypeBytes[want], (first + n) * dtypeBytes[want]);
      if (part.length !== n * dtypeBytes[want]) throw new Error(`decoded ${all.length} bytes, too few for elements ${first}..${first + n}`);
      lib.writeNow(dst, part, part.length);
      return Promise.resolve();
    } catch (e) {
      return Promise.reject(new Error(`loading weight ${src.name} (${src.dtype}[${src.shape.join(', ')}]) from ${src.path}: ${(e as Error).message}`));
    }
  }
  const sdt = DT_CODE[src.dtype];
  return new Promise((resolve, reject) => {
    lib.readFileAsync(src.path, fileOffset, nbytes, dst, sdt, toF32 ? DT_CODE.f32 : sdt, (err, rc) => {
      if (err) reject(err instanceof Error ? err : new Error(String(err)));
      else if (rc !== 0) {
        reject(new Error(`loading weight ${src.name} (${src.dtype}[${src.shape.join(', ')}]) from ${src.path} at ` +
          `byte ${fileOffset}, ${nbytes} bytes: ${describeCode(rc)}`));
      } else resolve();
    });
  });
}
