/** node:os for the page: what the browser says about the machine. */
export const availableParallelism = (): number => navigator.hardwareConcurrency || 1;
export const cpus = (): unknown[] => Array.from({ length: availableParallelism() }, () => ({}));
/** navigator.deviceMemory is in GiB, rounded and capped at 8 by the browser; 8 GiB when unknown. */
export const totalmem = (): number => ((navigator as unknown as { deviceMemory?: number }).deviceMemory ?? 8) * 2 ** 30;
export const tmpdir = (): string => "/tmp";
export const platform = (): string => "browser";
export default { availableParallelism, cpus, totalmem, tmpdir, platform };
