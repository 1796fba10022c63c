/** Errors the trainers throw on purpose, so a training loop can tell "this step blew up, nothing was
 *  applied" from a bug. */

/** A loss or gradient norm came out NaN or ±Inf. Thrown before any weight or optimizer state changes,
 *  so the caller may skip the batch, lower the learning rate, or stop and keep the last checkpoint. */
export class NonFiniteError extends Error {
  constructor(
    readonly what: string,
    readonly value: number,
  ) {
    super(`${what} is ${value}; expected a finite number (no update was applied)`);
    this.name = "NonFiniteError";
  }
}
