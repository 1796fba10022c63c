import { defineConfig } from "vitest/config";

// Two cores: run test files in two forked processes; numeric tests on wasm can take seconds.
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    pool: "forks",
    maxWorkers: 2,
    testTimeout: 120_000,
    hookTimeout: 120_000,
  },
});
