// The dashboard's end-to-end tests (e2e/), against a running SpecDeck that serves the built
// dashboard: tests/e2e/test_dashboard.py starts `specdeck run` and runs them with
//   SPECDECK_URL        the server (http://127.0.0.1:<port>)
//   SPECDECK_KEY        an API key of its project
//   SPECDECK_DEMO_DATA  the demo conversations (a .jsonl path) to upload; not uploaded yet
//                       (the test runs `specdeck run --no-demo`)
//   SPECDECK_ARTIFACTS  where screenshots and failure traces go (default test-results)
//   PLAYWRIGHT_CHROMIUM the browser (default Debian's chromium-headless-shell)
import path from "node:path";
import { defineConfig } from "@playwright/test";

const artifacts = path.resolve(process.env.SPECDECK_ARTIFACTS ?? "test-results");

export default defineConfig({
  testDir: "e2e",
  outputDir: path.join(artifacts, "output"),
  // flow.spec.ts trains a model on the CPU: one worker, files in order, no retries.
  workers: 1,
  fullyParallel: false,
  retries: 0,
  forbidOnly: true,
  timeout: 15 * 60_000,
  expect: { timeout: 60_000 },  // a loaded 2-core CI machine
  reporter: "list",
  use: {
    baseURL: process.env.SPECDECK_URL,
    browserName: "chromium",
    launchOptions: { executablePath: process.env.PLAYWRIGHT_CHROMIUM ?? "/usr/lib/chromium/chromium-headless-shell" },
    viewport: { width: 1280, height: 800 },
    actionTimeout: 30_000,
    navigationTimeout: 30_000,
    screenshot: "only-on-failure",
    // A failure's trace keeps each action's DOM snapshot; no screencast of every frame (a fifth
    // of the browser's CPU in the flow).
    trace: { mode: "retain-on-failure", screenshots: false },
  },
});
