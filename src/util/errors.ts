/** The errors thrown on purpose, by type: a usage error the user fixes on the command line (runMain
 * exits 2), a file of theirs that is corrupt (a usage error too), and a non-finite step the trainers refuse
 * to apply, so a training loop can tell "this
 *  step blew up, nothing was applied" from a bug. */

/** A bad flag or argument: the user can fix it by changing the command line. Exits with code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** A file the user gave (model weights, config.json, an adapter, a checkpoint) is not what it must be:
 *  truncated, corrupt, not JSON, not the format. Bad input like a bad flag (runMain exits 2); the
 *  message names the file. */
export class BadFileError extends UsageError {
  constructor(message: string) {
    super(message);
    this.name = "BadFileError";
  }
}

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
