// Entry of a grammar host thread (grammar-host-worker.ts). On Node 20 a worker thread does not
// inherit the parent's `--import tsx` loader, so it registers tsx itself before loading TypeScript.
import { register } from 'tsx/esm/api';

register();
await import('./grammar-host-worker.ts');
