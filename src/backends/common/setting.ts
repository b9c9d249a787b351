// A module-level switch: its value is read from the environment at startup, and tests and
// benchmarks change it through the module's setter, which returns the old value to restore.
export class Setting<T> {
  constructor(public value: T) {}

  /** Sets the value; returns the old one. */
  set(v: T): T {
    const old = this.value;
    this.value = v;
    return old;
  }
}
