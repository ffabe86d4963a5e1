// The dashboard's whole story, as a user clicks through it (issue 10, "Done when"): sign in,
// upload data, train the demo bake-off (three drafters, issue 58), watch it live and its
// leaderboard fill in, deploy a candidate that did not win with traffic capture on, chat with it, watch its live acceptance and capture, promote it to the other
// epoch's checkpoint and roll it back (issue 12), retrain it and cancel that job, see a refused
// delete, store a secret, add a webhook and follow its deliveries, revoke the key in use.
// One browser tab for all of it; each numbered step is a test.step, so a failure names it.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { expect, test, type BrowserContext, type Locator, type Page, type Request as PlaywrightRequest } from "@playwright/test";
import { acceptNextDialog, clearState, env, fillIfPresent, saveState, screenshotPath, signIn } from "./support";

const TERMINAL = /succeeded|failed|cancelled/i;
// A promotion or rollback: a new engine's start, the route cache's expiry and the old engine's
// drain. Seconds when the deployment's vLLM preloader forks the engine; over two minutes were
// seen on a loaded 2-core machine with a fresh vLLM start. A bound for a hang, not a goal.
const SWITCH_TIMEOUT = 8 * 60_000;
const run = Date.now().toString(36);
const DATASET_NAME = `e2e-demo-${run}`;
const DEPLOYMENT_NAME = `e2e-demo-${run}`;
const JOB_NAME = `Demo drafter ${run}`;

/** A screenshot of one part of the page at both sizes, with no horizontal overflow at either. */
async function screenshotSizes(page: Page, part: Locator, name: string): Promise<void> {
  for (const size of [{ width: 1280, height: 800 }, { width: 390, height: 844 }]) {
    await page.setViewportSize(size);
    await part.screenshot({ path: screenshotPath(name, size.width, size.height) });
    const width = await page.evaluate(() => document.scrollingElement!.scrollWidth);
    expect(width, `${name}: no horizontal overflow at ${size.width}px`).toBeLessThanOrEqual(size.width + 1);
  }
  await page.setViewportSize({ width: 1280, height: 800 });
}

/** One tab for a serial group's tests (Playwright traces it, and screenshots it on a failure). */
function useTab(): () => Page {
  let context: BrowserContext;
  let page: Page;
  test.beforeAll(async ({ browser }) => {
    context = await browser.newContext({ baseURL: env("SPECDECK_URL"), viewport: { width: 1280, height: 800 } });
    page = await context.newPage();
  });
  test.afterAll(async () => {
    await context.close();
  });
  return () => page;
}

test.describe.serial("the demo flow", () => {
  const tab = useTab();
  let page: Page;
  // What the steps make, for the later steps.
  let datasetId = "";
  let jobId = "";
  let deploymentId = "";
  let runnerUp = ""; // the bake-off's candidate that is deployed: ranked second, not the winner

  test.beforeAll(() => {
    clearState();
    page = tab();
  });

  /** Fill the New job form from its demo preset, a bake-off of three drafters the CPU can serve
   * (dflash-b8, dflash-b4, eagle3), checking its kind-specific fields and a kind the local runtime
   * refuses on the way. */
  async function newDemoJob(options: { name: string; epochs: number }): Promise<string> {
    await page.goto("/jobs");
    await page.getByRole("link", { name: "New job" }).or(page.getByRole("button", { name: "New job" })).click();
    await expect(page).toHaveURL(/\/jobs\/new$/);
    await expect(page.getByRole("button", { name: "Create job" })).toBeVisible();
    await page.getByRole("button", { name: /use demo settings/i }).click();
    // Under the local runtime there are no GPUs to choose; the form says what suits a CPU.
    await expect(page.getByTestId("local-resources")).toBeVisible();
    await expect(page.getByTestId("local-resources")).toContainText("dspark and dflash2 need a GPU host");
    await expect(page.getByLabel(/^Trainer GPUs/)).toHaveCount(0);
    // The preset is a bake-off: three candidates the CPU can serve, sharing the demo's settings.
    const rows = page.getByRole("group", { name: /^Candidate \d$/ });
    await expect(rows).toHaveCount(3);
    await expect(page.getByLabel("Kind of candidate 1", { exact: true })).toHaveValue("dflash");
    await expect(page.getByLabel("Name of candidate 1", { exact: true })).toHaveValue("dflash-b8");
    await expect(page.getByLabel("Block size of candidate 1", { exact: true })).toHaveValue("8");
    await expect(page.getByLabel("Block size of candidate 2", { exact: true })).toHaveValue("4");
    await expect(page.getByLabel("Layers of candidate 2", { exact: true })).toHaveValue("1");
    await expect(page.getByLabel("Kind of candidate 3", { exact: true })).toHaveValue("eagle3");
    // Kind-specific fields: an EAGLE-3 drafter has no block size and no max anchors.
    await expect(page.getByLabel("Block size of candidate 3", { exact: true })).toHaveCount(0);
    await expect(page.getByLabel("Layers of candidate 3", { exact: true })).toHaveValue("1");
    await expect(page.getByLabel("Max anchors", { exact: true })).toHaveValue("32");
    // A row added (its fields empty: they take the speculator's), then removed.
    await page.getByRole("button", { name: "Add candidate" }).click();
    await expect(rows).toHaveCount(4);
    await expect(page.getByLabel("Block size of candidate 4", { exact: true })).toHaveAttribute("placeholder", "8");
    await page.getByRole("button", { name: "Remove candidate 4" }).click();
    await expect(rows).toHaveCount(3);
    await page.getByLabel("Kind", { exact: true }).selectOption("eagle3");
    await expect(page.getByLabel("Block size", { exact: true })).toHaveCount(0);
    await expect(page.getByLabel("Max anchors", { exact: true })).toHaveCount(0);
    await expect(page.getByLabel("TTT steps", { exact: true })).toHaveValue("3");
    await page.getByLabel("Kind", { exact: true }).selectOption("dflash");
    await expect(page.getByLabel("Block size", { exact: true })).toHaveValue("8");

    await page.getByLabel("Name", { exact: true }).fill(options.name);
    const dataset = page.getByLabel("Dataset", { exact: true });
    await expect(dataset.locator(`option[value="${datasetId}"]`)).toHaveCount(1);
    await dataset.selectOption(datasetId);
    // Every candidate takes the shared epochs (its own field left empty shows them greyed).
    await page.getByLabel("Epochs", { exact: true }).fill(String(options.epochs));
    await expect(page.getByLabel("Epochs of candidate 2", { exact: true })).toHaveAttribute("placeholder", String(options.epochs));
    await page.getByLabel("Evaluate after training", { exact: true }).setChecked(true);
    await fillIfPresent(page, /^(evaluation )?prompts$/i, "4");
    await fillIfPresent(page, /^(evaluation )?max (new )?tokens$/i, "32");
    // The bake-off is ranked by speedup: the verifier alone and n-gram drafting are served beside
    // the candidates (the API's defaults), in rounds.
    await expect(page.getByLabel(/^Measure the speedup/)).toBeChecked();
    await expect(page.getByLabel(/^Compare with n-gram/)).toBeChecked();
    await expect(page.getByLabel("Rounds", { exact: true })).toHaveValue("3");

    // A kind the local runtime cannot serve: the API's 422 at that candidate's Kind field.
    const kind2 = page.getByLabel("Kind of candidate 2", { exact: true });
    await kind2.selectOption("dspark");
    await page.getByRole("button", { name: "Create job" }).click();
    await expect(kind2).toHaveAttribute("aria-invalid", "true");
    await expect(kind2).toHaveAccessibleDescription(/dspark .*GPU.*vllm runtime/);
    await expect(page).toHaveURL(/\/jobs\/new$/);
    await screenshotSizes(page, page.getByRole("group", { name: "Bake-off candidates" }), "new-job-bakeoff");
    await kind2.selectOption("dflash");
    await expect(kind2).not.toHaveAttribute("aria-invalid", "true");
    await expect(page.getByLabel("Block size of candidate 2", { exact: true })).toHaveValue("4");
    // The plan preview: the API plans the bake-off without a complaint.
    const plan = page.getByRole("region", { name: "Plan preview" });
    await expect(plan.locator(".plan-stages > li").first()).toBeVisible({ timeout: 30_000 });
    await expect(plan.getByRole("alert")).toHaveCount(0);

    await page.getByRole("button", { name: "Create job" }).click();
    await expect(page).toHaveURL(/\/jobs\/job_[0-9a-f]+$/, { timeout: 30_000 });
    const id = new URL(page.url()).pathname.split("/").pop()!;
    await expect(page.getByRole("heading", { level: 1 })).toContainText(id);
    return id;
  }

  test("sign in and upload data", async () => {
    await test.step("1. sign in with the key", async () => {
      await signIn(page, env("SPECDECK_KEY"));
      await expect(page.getByTestId("project-name")).toHaveText("default");
    });

    await test.step("2. a bad JSONL file is refused, line by line", async () => {
      const bad = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "specdeck-e2e-")), "bad.jsonl");
      fs.writeFileSync(
        bad,
        '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n' +
          '{"messages": "not a list"}\n' +
          '{"x": 1}\n',
      );
      await page.getByRole("link", { name: "Datasets", exact: true }).click();
      await expect(page.getByRole("heading", { level: 1, name: "Datasets" })).toBeVisible();
      await page.getByLabel("JSONL file", { exact: true }).setInputFiles(bad);
      await page.getByRole("button", { name: "Upload" }).click();
      await expect(page.getByRole("list", { name: "Problems in the file" })).toContainText("Line 2:");
      await expect(page.getByRole("list", { name: "Problems in the file" })).toContainText("Line 3:");
      await expect(page.getByText("The file has 2 problems, listed below.")).toBeVisible();
      await expect(page.getByText("error.errors")).toHaveCount(0); // the API's pointer, not for people
    });

    await test.step("3. upload the demo dataset", async () => {
      await page.getByLabel("JSONL file", { exact: true }).setInputFiles(env("SPECDECK_DEMO_DATA"));
      await page.getByLabel("Name (optional)", { exact: true }).fill(DATASET_NAME);
      await page.getByRole("button", { name: "Upload" }).click();
      await expect(page.getByRole("list", { name: "Problems in the file" })).toHaveCount(0);
      const row = page.getByRole("row").filter({ has: page.getByRole("button", { name: `Delete dataset ${DATASET_NAME}` }) });
      await expect(row).toBeVisible();
      datasetId = /ds_[0-9a-f]{24}/.exec((await row.textContent()) ?? "")?.[0] ?? "";
      expect(datasetId, "the new row shows the dataset's id").not.toBe("");
    });

    await test.step("3b. preview the dataset's rows, a page at a time", async () => {
      const lines = fs.readFileSync(env("SPECDECK_DEMO_DATA"), "utf8").split("\n").filter((l) => l.trim());
      // The demo conversations are ShareGPT lines: {"conversations": [{"from", "value"}, ...]}.
      const turnsOf = (line: string) =>
        (JSON.parse(line) as { conversations: { from: string; value: string }[] }).conversations.map((t) => t.value.slice(0, 40).trim());
      await page.getByRole("button", { name: `Preview the rows of ${DATASET_NAME}` }).click();
      const preview = page.getByRole("region", { name: `Rows of ${DATASET_NAME}` });
      const first = preview.getByRole("listitem", { name: "Row 1" });
      for (const text of turnsOf(lines[0])) await expect(first).toContainText(text);
      await expect(preview).toContainText(`Rows 1–5 of ${lines.length}`);
      await preview.getByRole("button", { name: "Next" }).click();
      await expect(preview).toContainText(`Rows 6–10 of ${lines.length}`);
      await expect(preview.getByRole("listitem", { name: "Row 6" })).toContainText(turnsOf(lines[5])[0]);
      // At 390px the Datasets table scrolls sideways; its preview stays on the screen.
      await page.setViewportSize({ width: 390, height: 844 });
      const box = await preview.boundingBox();
      expect(box && box.x >= 0 && box.x + box.width <= 390, `the preview fits 390px: ${JSON.stringify(box)}`).toBe(true);
      await screenshotSizes(page, preview, "dataset-preview");
      await page.getByRole("button", { name: `Hide the rows of ${DATASET_NAME}` }).click();
      await expect(preview).toHaveCount(0);
    });
  });

  test("train the demo bake-off and watch it", async () => {
    // Three candidates trained one after another, then five engines served side by side, on two
    // cores: a bound for a hang, not a goal.
    test.setTimeout(30 * 60_000);
    await test.step("4. create the demo bake-off through the New job form", async () => {
      jobId = await newDemoJob({ name: JOB_NAME, epochs: 2 });
      saveState({ jobId });
    });

    const status = page.getByTestId("job-status");
    const stage = page.getByTestId("job-stage");

    // What the live page asks the API for while the job runs (checked in step 7b).
    const requests: { url: URL; at: number }[] = [];
    const watchStart = Date.now();
    const watch = (request: PlaywrightRequest) => {
      const url = new URL(request.url());
      if (url.pathname.startsWith("/api/")) requests.push({ url, at: Date.now() });
    };
    page.on("request", watch);

    await test.step("5. the job moves through its stages live", async () => {
      // A mark in this document: still there at the end means the page never reloaded.
      await page.evaluate(() => ((window as unknown as { e2eMark: boolean }).e2eMark = true));
      // The leaderboard is there from the start, every candidate listed; what each row's status
      // says is recorded as it changes (checked in step 7c: the table filled in live).
      const board = page.getByRole("table", { name: "Leaderboard" });
      await expect(board.locator("tbody tr")).toHaveCount(3);
      await page.evaluate(() => {
        const seen: Record<string, string[]> = {};
        (window as unknown as { e2eStatuses: typeof seen }).e2eStatuses = seen;
        const record = () => {
          for (const row of Array.from(document.querySelectorAll<HTMLElement>("tr[data-candidate]"))) {
            const name = row.dataset.candidate!;
            const status = row.querySelector('[data-label="Status"] .badge')?.textContent ?? "";
            const list = (seen[name] ??= []);
            if (status && list[list.length - 1] !== status) list.push(status);
          }
        };
        record();
        new MutationObserver(record).observe(document.body, { subtree: true, childList: true, characterData: true });
      });
      const events = page.getByRole("list", { name: "Event timeline" }).getByRole("listitem");
      await expect(status).toBeVisible();
      const first = await events.count();
      const stages = new Set<string>();
      await expect
        .poll(
          async () => {
            const text = (await stage.textContent())?.trim();
            if (text) stages.add(text);
            return stages.size;
          },
          { message: "the job's stage changes on the page", timeout: 6 * 60_000, intervals: [250] },
        )
        .toBeGreaterThanOrEqual(2);
      // The stage strip: this job's stages in order, the one under way marked as the current step.
      const strip = page.getByRole("list", { name: "Pipeline stages" });
      await expect(strip.getByRole("listitem")).toHaveText(["Start verifier", "Prepare data", "Train", "Evaluate"]);
      await expect(strip.locator('[aria-current="step"]')).toHaveCount(1, { timeout: 30_000 });
      await expect
        .poll(() => events.count(), { message: "the event timeline grows", timeout: 5 * 60_000 })
        .toBeGreaterThan(first);
      expect(await page.evaluate(() => (window as unknown as { e2eMark?: boolean }).e2eMark)).toBe(true);
    });

    await test.step("6. the training loss chart has data points, and the progress counts steps of a candidate", async () => {
      const loss = page.getByRole("region", { name: "Training loss" });
      await expect
        .poll(() => loss.locator(".recharts-line-dot, .recharts-dot").count(), { timeout: 6 * 60_000 })
        .toBeGreaterThan(0);
      // During training: "epoch 1/N · step S · time left known after epoch 1", then with a
      // total, a percent and the time left; once trained, "trained: T of T steps".
      await expect(page.locator(".job-head .progress")).toContainText(/step \d+|trained: \d+ of \d+ steps/, {
        timeout: 6 * 60_000,
      });
      // In a candidate's second epoch its total is known: steps of all, the percent and the time
      // left (the whole epoch long; the page asks every 10 s). The progress names the candidate.
      await expect(page.locator(".job-head .progress")).toContainText(
        /^(dflash-b8|dflash-b4|eagle3) \([123] of 3\) · epoch 2\/2 · step \d+ of \d+ \(\d+(\.\d)?%\) · about (\d+[hms] ?)+left/,
        { timeout: 8 * 60_000 },
      );
      await page.locator(".job-head").screenshot({ path: screenshotPath("job-training-eta", 1280, 800) });
    });

    await test.step("6b. the served evaluation has a bar of its own: its steps and percent", async () => {
      // Each engine's start and each held-out prompt is a step; the engine's start alone takes
      // seconds on a CPU, so the page (which asks every 10 s) sees the bar.
      const evaluating = page.getByTestId("stage-progress");
      await expect(evaluating).toContainText(/(starting the engines? for|serving|prompt \d+ of \d+ done).* · \d+ of \d+ steps \(\d+(\.\d)?%\)/, {
        timeout: 15 * 60_000,
      });
      await expect(page.getByRole("progressbar", { name: "Evaluate progress" })).toBeVisible();
      await page.locator(".job-head").screenshot({ path: screenshotPath("job-evaluating", 1280, 800) });
    });

    await test.step("7. the job succeeds with an evaluated best checkpoint per candidate", async () => {
      await expect(status).toHaveText(TERMINAL, { timeout: 10 * 60_000 });
      await expect(status).toHaveText(/succeeded/i);
      const checkpoints = page.getByRole("table", { name: "Checkpoints" });
      // Grouped by candidate, each with its trainer's best.
      for (const name of ["dflash-b8", "dflash-b4", "eagle3"])
        await expect(checkpoints.getByRole("row").filter({ hasText: name }).filter({ hasText: /\bbest\b/ })).toHaveCount(1);
      await expect(page.getByRole("region", { name: "Served acceptance", exact: true })).toContainText(/\d\.\d/);
      const progress = page.getByRole("progressbar", { name: "Training progress" });
      await expect(page.locator(".job-head .progress")).toContainText(/^[\w.-]+ \([123] of 3\) · trained: (\d+) of \1 steps$/);
      await expect(page.getByRole("list", { name: "Pipeline stages" }).locator('[data-state="done"]')).toHaveCount(4);
      expect(await progress.getAttribute("value")).toBe(await progress.getAttribute("max")); // full
      // One epoch numbering, from 1: the events' epochs and the checkpoint table's agree (two
      // epochs each: 1 and 2, never a 0).
      const timeline = page.getByRole("list", { name: "Event timeline" });
      for (const name of ["dflash-b8", "dflash-b4", "eagle3"]) {
        await expect(timeline).toContainText(`${name}: training epoch 1 of 2 started`);
        await expect(timeline).toContainText(`${name}: checkpoint for epoch 2 saved`);
        const epochs = checkpoints.getByRole("row").filter({ hasText: name }).getByTestId("checkpoint-epoch");
        await expect(epochs).toHaveText(["1", "2"]);
      }
      await expect(timeline).not.toContainText(/\bepoch 0\b/);
    });

    await test.step("7b. the live page followed its events and log through streams, and asked for little else", async () => {
      page.off("request", watch);
      const minutes = (Date.now() - watchStart) / 60_000;
      const streams = requests.filter((r) => r.url.pathname.endsWith("/stream"));
      const others = requests.filter((r) => !r.url.pathname.endsWith("/stream"));
      const paths = others.map((r) => r.url.pathname.replace(/job_\w+/, "{id}"));
      const tally = new Map<string, number>();
      for (const p of paths) tally.set(p, (tally.get(p) ?? 0) + 1);
      const counts = [...tally].map(([p, n]) => `${p}: ${n}`);
      // The log: one stream (opened again only if dropped, and once more for its end), not a
      // request per batch of lines; the events: one stream.
      const logStreams = streams.filter((r) => r.url.pathname.endsWith("/logs/stream")).length;
      expect(logStreams, "the log was followed through its stream").toBeGreaterThan(0);
      expect(streams.length, "streams opened").toBeLessThanOrEqual(6);
      expect(others.filter((r) => r.url.pathname.endsWith("/logs")), "no log polling").toHaveLength(0);
      expect(others.length / minutes, `requests a minute besides the streams, over ${minutes.toFixed(1)} min: ${counts.join(", ")}`)
        .toBeLessThanOrEqual(20);
      // Metrics: whole once (when the page opened, in step 4), then only what is new.
      const metrics = others.filter((r) => r.url.pathname.endsWith("/metrics"));
      expect(metrics.filter((r) => !r.url.searchParams.has("after")).length, "whole metric fetches").toBeLessThanOrEqual(1);
      expect(metrics.length, "metrics were refreshed while the job ran").toBeGreaterThan(1);
    });

    await test.step("7c. the leaderboard filled in live: ranks, the winner in words, baselines, speedup against cost", async () => {
      const leaderboard = page.getByRole("region", { name: "Leaderboard" });
      const rows = leaderboard.getByRole("table", { name: "Leaderboard" }).locator("tbody tr");
      await expect(rows).toHaveCount(3);
      // Each row's status as the page showed it over the run: every candidate was seen before
      // it was evaluated (pending or training), and ends evaluated.
      const seen = await page.evaluate(() => (window as unknown as { e2eStatuses: Record<string, string[]> }).e2eStatuses);
      for (const name of ["dflash-b8", "dflash-b4", "eagle3"]) {
        const statuses = seen[name] ?? [];
        expect(statuses[statuses.length - 1], `${name}: ${statuses.join(" → ")}`).toBe("evaluated");
        expect(statuses.length, `${name} changed on the page: ${statuses.join(" → ")}`).toBeGreaterThan(1);
        expect(statuses.some((s) => s === "pending" || s === "training"), `${name}: ${statuses.join(" → ")}`).toBe(true);
      }
      // Best first: ranks 1 to 3, the winner said in words (and in the header), a speedup ± its spread each.
      await expect(rows.locator('[data-label="Rank"]')).toHaveText([/^#1/, /^#2/, /^#3/]);
      await expect(rows.first().getByTestId("winner-badge")).toHaveText("winner");
      await expect(leaderboard.getByTestId("winner-badge")).toHaveCount(1);
      const winner = (await rows.first().getAttribute("data-candidate"))!;
      await expect(page.getByTestId("job-winner")).toHaveText(winner);
      await expect(leaderboard.getByTestId("leaderboard-winner")).toContainText(`Winner: ${winner}`);
      await expect(rows.locator('[data-label="Speedup"]')).toHaveText([/^×\d+(\.\d+)? ±\d/, /^×\d/, /^×\d/]);
      await expect(rows.locator('[data-label="Lossless"]').first()).toContainText(/^yes \(4\/4\)/);
      await expect(rows.locator('[data-label="Training cost"]').first()).toContainText(/CPU/);
      // The baselines the speedups are measured against.
      const baselines = leaderboard.getByRole("group", { name: "Baselines" });
      await expect(baselines).toContainText(/\d tok\/s\s*No speculation/);
      await expect(baselines).toContainText(/\d tok\/s\s*n-gram drafting/);
      // A point per candidate on the chart; the winner's is labelled as such.
      const chart = leaderboard.getByRole("region", { name: "Speedup against training cost" });
      await expect(chart.locator(".recharts-scatter-symbol")).toHaveCount(3);
      await expect(chart).toContainText(new RegExp(`${winner}\\s*\\(winner\\)`));
      // Each candidate's training loss is a line of its own.
      await expect(page.getByRole("region", { name: "Training loss" }).locator(".recharts-legend-item")).toHaveCount(3);
      runnerUp = (await rows.nth(1).getAttribute("data-candidate"))!;
      await screenshotSizes(page, leaderboard, "job-leaderboard");
    });
  });

  test("deploy a candidate that did not win and chat with it", async () => {
    await test.step("8. deploy the runner-up from its leaderboard row with capture on, wait for ready, stream an answer in the playground", async () => {
      await page.goto(`/jobs/${jobId}`);
      const row = page.getByRole("table", { name: "Leaderboard" }).locator(`tr[data-candidate="${runnerUp}"]`);
      await expect(row.getByTestId("winner-badge")).toHaveCount(0);
      await row.getByRole("button", { name: `Deploy candidate ${runnerUp}` }).click();
      await expect(page).toHaveURL(/\/deployments\/new\?checkpoint=ckpt_/);
      await expect(page.getByLabel("Checkpoint id", { exact: true })).toHaveValue(/^ckpt_/);
      // The form says which candidate it is, and that it did not win.
      await expect(page.getByTestId("deploy-candidate")).toContainText(runnerUp);
      await expect(page.getByTestId("deploy-candidate")).toContainText("not the winner");
      // What a user chooses by: its served speedup (± its spread); the worker's slot is free.
      await expect(page.getByTestId("deploy-speedup")).toHaveText(/^×\d+\.\d\d( ±\d+\.\d\d)?$/);
      await expect(page.getByTestId("no-free-slot")).toHaveCount(0);
      // A candidate whose evaluation found it slower than no speculation is deployed only when
      // confirmed (this machine's speed decides; verdict.spec.ts checks that path on its own).
      const anyway = page.getByLabel(/^Deploy it anyway/);
      if (await anyway.count()) await anyway.check();
      await page.getByLabel("Name", { exact: true }).fill(DEPLOYMENT_NAME);
      // Capture is opt-in; ticked, it shows the API's defaults.
      await expect(page.getByLabel("Sample rate", { exact: true })).toHaveCount(0);
      await page.getByLabel("Capture a sample of the requests", { exact: true }).check();
      await expect(page.getByLabel("Max rows", { exact: true })).toHaveValue("100000");
      await expect(page.getByLabel("Retention (days)", { exact: true })).toHaveValue("30");
      const sampleRate = page.getByLabel("Sample rate", { exact: true });
      await expect(sampleRate).toHaveValue("0.1");
      await screenshotSizes(page, page.getByRole("form", { name: "New deployment" }), "new-deployment-capture");
      await sampleRate.fill("1.5");
      await page.getByRole("button", { name: "Create deployment" }).click();
      await expect(sampleRate).toHaveAttribute("aria-invalid", "true");
      await sampleRate.fill("1"); // every request, so that the chat below is captured
      await page.getByRole("button", { name: "Create deployment" }).click();
      await expect(page).toHaveURL(/\/deployments\/dep_[0-9a-f]+$/, { timeout: 30_000 });
      deploymentId = new URL(page.url()).pathname.split("/").pop()!;
      saveState({ deploymentId });
      await expect(page.getByTestId("deployment-status")).toHaveText(/ready/i, { timeout: 5 * 60_000 });
      // A CPU worker's serving slot, not a "GPU 0".
      await expect(page.locator("dt:text-is('Allocation') + dd")).toHaveText(/^serving slot \d+ \(CPU\)$/);
      // Its engine holds the worker's only serving slot: a new deployment's form says, before
      // anything is made, that it would wait.
      await page.goto("/deployments/new");
      await expect(page.getByTestId("no-free-slot")).toContainText("No worker has a free serving slot now");
      await page.goto(`/deployments/${deploymentId}`);

      await page.getByRole("link", { name: "Open in playground" }).click();
      await expect(page).toHaveURL(/\/playground\?deployment=/);
      await expect(page.getByLabel("Deployment", { exact: true }).locator("option:checked")).toContainText(DEPLOYMENT_NAME);
      // Prompts from the drafter's training data, offered to try: one click puts it in the box.
      const prompts = page.getByRole("group", { name: "Prompts from its training data" });
      await expect(prompts).toContainText(JOB_NAME);
      const firstPrompt = prompts.getByRole("button").first();
      const offered = (await firstPrompt.getAttribute("title")) ?? "";
      expect(offered, "a training prompt is offered").not.toBe("");
      await firstPrompt.click();
      await expect(page.getByLabel("Message", { exact: true })).toHaveValue(offered);
      await expect(page.getByLabel("Message", { exact: true })).toBeFocused();
      await screenshotSizes(page, page.getByRole("region", { name: "Request options" }), "playground-prompts");
      await fillIfPresent(page, /^max tokens$/i, "32");
      await page.getByRole("button", { name: "Send" }).click();
      const answer = page.getByRole("log", { name: "Answer" });
      await expect(answer).not.toBeEmpty({ timeout: 2 * 60_000 });
      // The answer's own stats (the page's hint also names TTFT: a bare /TTFT/ matches both).
      await expect(page.getByText(/^TTFT \d+ ms$/)).toBeVisible({ timeout: 2 * 60_000 });
      // Finished, not cut short by leaving the page: a reply cut short is not captured.
      await expect(page.getByRole("button", { name: "Stop" })).toHaveCount(0, { timeout: 2 * 60_000 });
      // The request's own acceptance length, which the engine reports with the reply.
      await expect(page.getByTestId("play-acceptance")).toHaveText(/^acceptance length \d+\.\d\d over \d+ draft steps?$/);
      await screenshotSizes(page, page.locator(".play-turn").last(), "playground-answer");
    });
  });

  test("watch the deployment, promote it and roll it back", async () => {
    const capture = page.getByRole("region", { name: "Traffic capture" });
    const live = page.getByRole("region", { name: "Live acceptance", exact: true });
    const promotions = page.getByRole("region", { name: "Promotions" });
    const rows = promotions.getByRole("table", { name: "Promotions" }).getByRole("row"); // newest first
    const summary = page.getByRole("region", { name: "Deployment", exact: true });
    let other = ""; // the checkpoint promoted to

    /** A chat request through the gateway, as any OpenAI client sends one. */
    async function chat(content: string): Promise<void> {
      const reply = await page.request.post("/v1/chat/completions", {
        headers: { Authorization: `Bearer ${env("SPECDECK_KEY")}` },
        data: { model: DEPLOYMENT_NAME, messages: [{ role: "user", content }], max_tokens: 24 },
      });
      expect(reply.status()).toBe(200);
    }

    await test.step("9. the chat is captured, and the live acceptance chart has points", async () => {
      await page.goto(`/deployments/${deploymentId}`);
      await expect(capture).toContainText(/Rows\s*1 of 100,000/);
      await expect(capture.getByRole("link", { name: /^ds_[0-9a-f]{24}$/ })).toHaveAttribute("href", /^\/datasets#ds_/);
      // The worker scrapes the engine's /metrics every second here (SPECDECK_LIVE_METRICS_SECONDS).
      const chart = live.getByRole("region", { name: "Live acceptance length" });
      await expect.poll(() => chart.locator(".recharts-line-dot, .recharts-dot").count(), { timeout: 60_000 }).toBeGreaterThan(0);
      await expect(live.locator(".stat").filter({ hasText: "Requests" }).locator(".value")).toHaveText(/^[1-9]/);
      // Throughput says what it averages over (the playground shows one request's own).
      await expect(live.locator(".stat").filter({ hasText: "Tokens / s" })).toContainText("all traffic, last 10 min");
      // The drafter's served evaluation is what the live numbers are held to.
      await expect(live).not.toContainText("no served evaluation to compare with");
      // Its dataset: the row on the Datasets page, marked.
      await capture.getByRole("link", { name: /^ds_/ }).click();
      await expect(page).toHaveURL(/\/datasets#ds_[0-9a-f]{24}$/);
      const row = page.locator(`tr#${new URL(page.url()).hash.slice(1)}`);
      await expect(row).toHaveClass(/target/);
      await expect(row).toContainText("captured traffic");
      await page.goto(`/deployments/${deploymentId}`);
    });

    await test.step("9a. the replicas: one ready; a second waits for a serving slot, then is scaled away", async () => {
      const replicas = page.getByRole("region", { name: "Replicas" });
      await expect(replicas.getByRole("heading")).toContainText("1 of 1 ready");
      await expect(replicas.getByTestId("replica-0")).toContainText(/ready/i);
      const count = replicas.getByLabel("Replicas");
      await count.fill("0");
      await replicas.getByRole("button", { name: "Scale" }).click();
      await expect(replicas.getByRole("alert")).toHaveText("A whole number from 1 to 16");
      // `specdeck run`'s worker has one serving slot, held by replica 0: replica 1 waits for one.
      await count.fill("2");
      await replicas.getByRole("button", { name: "Scale" }).click();
      await expect(replicas.getByTestId("replica-1")).toContainText(/pending/i);
      await expect(replicas.getByTestId("replica-1").getByTitle(/waiting for a free serving slot/)).toBeVisible();
      await expect(replicas.getByRole("heading")).toContainText("1 of 2 ready");
      await count.fill("1");
      await replicas.getByRole("button", { name: "Scale" }).click();
      await expect(replicas.getByTestId("replica-1")).toHaveCount(0);
      await expect(replicas.getByRole("heading")).toContainText("1 of 1 ready");
      await screenshotSizes(page, replicas, "deployment-replicas");
    });

    await test.step("10. nothing to roll back to (the button says so), an unknown checkpoint (422)", async () => {
      const rollBack = promotions.getByRole("button", { name: `Roll back deployment ${DEPLOYMENT_NAME}` });
      await expect(rollBack).toBeDisabled();
      await expect(rollBack).toHaveAttribute("title", /Nothing to roll back to/);

      await promotions.getByRole("button", { name: "Promote…" }).click();
      const checkpoint = promotions.getByLabel("Checkpoint id", { exact: true });
      await checkpoint.fill(`ckpt_${"0".repeat(24)}`);
      acceptNextDialog(page);
      await promotions.getByRole("button", { name: "Promote", exact: true }).click();
      await expect(checkpoint).toHaveAttribute("aria-invalid", "true");
      await expect(checkpoint).toHaveAccessibleDescription(/no checkpoint with id/);
    });

    await test.step("11. promote to the candidate's other checkpoint: the switch succeeds, the new drafter is measured", async () => {
      const pick = promotions.getByLabel("Pick a checkpoint", { exact: true });
      // The bake-off's checkpoints are offered by candidate and epoch: the served candidate's other one.
      const offered = await pick.locator("option").allTextContents();
      const index = offered.findIndex((label) => label.startsWith(`${runnerUp} epoch `));
      expect(index, `${runnerUp}'s other epoch is offered: ${offered.join(" | ")}`).toBeGreaterThan(0);
      other = (await pick.locator("option").nth(index).getAttribute("value")) ?? "";
      expect(other, "the candidate's other epoch is offered").toMatch(/^ckpt_[0-9a-f]{24}$/);
      await pick.selectOption(other);
      await expect(promotions.getByLabel("Checkpoint id", { exact: true })).toHaveValue(other);
      // The live chart's tooltip, shown at its right end and hidden again, stays where it was:
      // it must not widen the page once it is 390px wide (run 47 found it 638px wide).
      const surface = live.getByRole("region", { name: "Live acceptance length" }).locator(".recharts-wrapper");
      const box = (await surface.boundingBox())!;
      await surface.hover({ position: { x: box.width - 20, y: box.height / 2 } });
      await page.mouse.move(0, 0);
      await screenshotSizes(page, promotions, "deployment-promote");
      acceptNextDialog(page);
      await promotions.getByRole("button", { name: "Promote", exact: true }).click();
      await expect(rows.nth(1)).toContainText("promote");
      await expect(rows.nth(1)).toContainText(/succeeded/, { timeout: SWITCH_TIMEOUT });
      await expect(summary).toContainText(other);
      // A request served by the new drafter: its own line on the chart.
      await chat("Hello there!");
      await expect(live.locator(".recharts-legend-item")).toHaveCount(2, { timeout: 60_000 });
      await expect(capture).toContainText(/Rows\s*2 of 100,000/);
    });

    await test.step("12. roll back: the first drafter serves again", async () => {
      acceptNextDialog(page);
      await promotions.getByRole("button", { name: `Roll back deployment ${DEPLOYMENT_NAME}` }).click();
      await expect(rows.nth(1)).toContainText("rollback");
      await expect(rows.nth(1)).toContainText(/succeeded/, { timeout: SWITCH_TIMEOUT });
      await expect(summary).not.toContainText(other);
      // Served again, the evaluated drafter is held against its served evaluation and the alert's threshold.
      await chat("What is a lighthouse for?");
      await expect(live.locator(".stat").filter({ hasText: "Evaluated acceptance length" }).locator(".value")).toHaveText(
        /^\d/,
        { timeout: 60_000 },
      );
      await expect(live.locator(".recharts-reference-line")).toHaveCount(2);
      await screenshotSizes(page, page.locator(".deployment-detail"), "deployment-flywheel");
    });
  });

  test("retrain the deployment and cancel that job", async () => {
    await test.step("13. retrain from the deployment page, then cancel the job on its page", async () => {
      await page.goto(`/deployments/${deploymentId}`);
      const promotions = page.getByRole("region", { name: "Promotions" });
      await promotions.getByRole("button", { name: "Retrain…" }).click();
      const form = promotions.getByRole("form", { name: "Retrain the drafter" });
      await expect(form.getByLabel("Dataset", { exact: true }).locator("option:checked")).toContainText("captured traffic");
      await expect(form.getByLabel("Epochs", { exact: true })).toHaveAttribute("placeholder", "2");
      await form.getByLabel("Epochs", { exact: true }).fill("50");
      await screenshotSizes(page, promotions, "deployment-retrain");
      await form.getByRole("button", { name: "Create retrain job" }).click();
      await expect(page).toHaveURL(/\/jobs\/job_[0-9a-f]+$/, { timeout: 30_000 });
      const status = page.getByTestId("job-status");
      await expect(status).toBeVisible();
      // It says what it retrains: its name, and the deployment it came from.
      await expect(page.getByRole("heading", { level: 1 })).toContainText(`retrain of ${DEPLOYMENT_NAME}`);
      await expect(page.getByRole("link", { name: deploymentId })).toBeVisible();
      acceptNextDialog(page);
      await page.getByRole("button", { name: "Cancel job" }).click();
      await expect(status).toHaveText(/cancelled/i, { timeout: 2 * 60_000 });
    });

    await test.step("13b. the jobs list's status filter is in the URL: a reload keeps it", async () => {
      await page.goto("/jobs");
      await page.getByLabel("Status", { exact: true }).selectOption("cancelled");
      await expect(page).toHaveURL(/\/jobs\?status=cancelled$/);
      await page.reload();
      await expect(page.getByLabel("Status", { exact: true })).toHaveValue("cancelled");
      const rows = page.getByRole("table").getByRole("row").filter({ has: page.locator("td") });
      await expect(rows.first()).toContainText("cancelled");
      await expect(rows.filter({ hasNotText: "cancelled" })).toHaveCount(0);
    });

    await test.step("13c. jobs are told apart by name, and found by part of it (kept in the URL)", async () => {
      await page.goto("/jobs");
      const rows = page.getByRole("table").getByRole("row").filter({ has: page.locator("td") });
      await expect(rows.filter({ hasText: jobId })).toContainText(JOB_NAME);
      const typed = `drafter ${run}`.toUpperCase();
      await page.getByLabel("Name", { exact: true }).fill(typed);
      await expect(page).toHaveURL(new RegExp(`/jobs\\?name=DRAFTER\\+${run}$`, "i"));
      await expect(rows).toHaveCount(1);
      await expect(rows.first()).toContainText(jobId);
      await page.reload();
      await expect(page.getByLabel("Name", { exact: true })).toHaveValue(typed);
      await expect(rows).toHaveCount(1);
      await page.getByLabel("Name", { exact: true }).fill(`no job is named this ${run}`);
      await expect(page.getByText(`No jobs named like “no job is named this ${run}”.`)).toBeVisible();
      // Back to every job through the menu: the box follows the URL.
      await page.getByRole("link", { name: "Jobs", exact: true }).click();
      await expect(page).toHaveURL(/\/jobs$/);
      await expect(page.getByLabel("Name", { exact: true })).toHaveValue("");
      await expect(rows.filter({ hasText: jobId })).toHaveCount(1);
    });

    await test.step("13d. clone the demo job: the New job form holds its settings", async () => {
      await page.goto(`/jobs/${jobId}`);
      await page.getByRole("link", { name: `Clone job ${jobId}` }).click();
      await expect(page).toHaveURL(new RegExp(`/jobs/new\\?clone=${jobId}$`));
      await expect(page.getByTestId("clone-note")).toContainText(`A copy of the settings of job ${JOB_NAME}`);
      await expect(page.getByLabel("Name", { exact: true })).toHaveValue(`${JOB_NAME} (clone)`);
      await expect(page.getByLabel("Dataset", { exact: true })).toHaveValue(datasetId);
      await expect(page.getByLabel("Verifier", { exact: true })).toHaveValue("demo");
      await expect(page.getByLabel("Runtime", { exact: true })).toHaveValue("local");
      await expect(page.getByLabel("Epochs", { exact: true })).toHaveValue("2");
      await expect(page.getByLabel("Block size", { exact: true })).toHaveValue("8");
      await expect(page.getByLabel("Evaluate after training", { exact: true })).toBeChecked();
      await expect(page.getByLabel(/^Measure the speedup/)).toBeChecked();
      await expect(page.getByLabel(/^Compare with n-gram/)).toBeChecked();
      // Its candidates come with it: their kinds, names and the settings where they differ.
      await expect(page.getByRole("group", { name: /^Candidate \d$/ })).toHaveCount(3);
      for (const [n, kind, name] of [[1, "dflash", "dflash-b8"], [2, "dflash", "dflash-b4"], [3, "eagle3", "eagle3"]]) {
        await expect(page.getByLabel(`Kind of candidate ${n}`, { exact: true })).toHaveValue(String(kind));
        await expect(page.getByLabel(`Name of candidate ${n}`, { exact: true })).toHaveValue(String(name));
      }
      await expect(page.getByLabel("Block size of candidate 2", { exact: true })).toHaveValue("4");
      await expect(page.getByLabel("Layers of candidate 3", { exact: true })).toHaveValue("1");
      // The copy is a valid job: the API plans it (POST /api/jobs/plan) without a complaint.
      await expect(page.getByTestId("local-resources")).toBeVisible();
      const plan = page.getByRole("region", { name: "Plan preview" });
      await expect(plan.locator(".plan-stages > li").first()).toBeVisible({ timeout: 30_000 });
      await expect(plan.getByRole("alert")).toHaveCount(0);
      await page.screenshot({ path: screenshotPath("new-job-clone", 1280, 800), fullPage: true });
      // A job that does not exist: said, and the form stays usable.
      await page.goto("/jobs/new?clone=job_000000000000000000000000");
      await expect(page.getByTestId("clone-note")).toContainText("could not be cloned");
      await expect(page.getByRole("button", { name: "Create job" })).toBeEnabled();
    });
  });

  test("a dataset in use cannot be deleted", async () => {
    await test.step("14. deleting the demo dataset shows the API's 409", async () => {
      await page.goto("/datasets");
      const remove = page.getByRole("button", { name: `Delete dataset ${DATASET_NAME}` });
      acceptNextDialog(page);
      await remove.click();
      const row = page.getByRole("row").filter({ has: remove });
      await expect(row.getByRole("alert")).toContainText(/used by job job_[0-9a-f]+.*cannot be deleted/);
      await expect(remove).toBeVisible(); // still listed
    });
  });
});

// Apart from the training flow, so that its failure does not hide these; last, as step 18 revokes
// the key the other steps use.
test.describe.serial("settings", () => {
  const tab = useTab();
  let page: Page;

  test.beforeAll(async () => {
    page = tab();
    await signIn(page, env("SPECDECK_KEY"));
  });

  test("a secret", async () => {
    await test.step("15. HF_TOKEN is saved and its value is never shown", async () => {
      const value = `hf_e2e_${run}_${Math.random().toString(36).slice(2)}`;
      await page.getByRole("link", { name: "Settings", exact: true }).click();
      const secrets = page.getByRole("region", { name: "Secrets" });
      await secrets.getByLabel("Secret name", { exact: true }).fill("HF_TOKEN");
      await secrets.getByLabel("Secret value", { exact: true }).fill(value);
      await secrets.getByRole("button", { name: "Save secret" }).click();
      await expect(secrets.getByRole("button", { name: "Delete secret HF_TOKEN" })).toBeVisible();
      await expect(secrets.getByLabel("Secret value", { exact: true })).toHaveValue("");
      expect(await page.content()).not.toContain(value);
      await page.reload();
      await expect(page.getByRole("region", { name: "Secrets" }).getByRole("button", { name: "Delete secret HF_TOKEN" })).toBeVisible();
      expect(await page.content()).not.toContain(value);
    });

  });

  test("a webhook and its deliveries", async () => {
    // test_dashboard.py allows 127.0.0.1 (SPECDECK_WEBHOOK_ALLOWED_HOSTS); nothing listens on
    // port 9, so the worker's first attempt fails with a refused connection.
    const HOOK = "http://127.0.0.1:9/hook";
    const webhooks = page.getByRole("region", { name: "Webhooks" });
    const url = webhooks.getByLabel("Endpoint URL", { exact: true });

    await test.step("16. a private address is refused at the URL field", async () => {
      await page.goto("/settings");
      await url.fill("http://10.0.0.1/hook");
      await webhooks.getByRole("checkbox", { name: /job\.succeeded/ }).check();
      await webhooks.getByRole("button", { name: "Add endpoint" }).click();
      await expect(url).toHaveAttribute("aria-invalid", "true");
      await expect(url).toHaveAccessibleDescription(/private or internal addresses/);
    });

    await test.step("17. an allowed endpoint: its secret once, a test event, a failed attempt, delete", async () => {
      await url.fill(HOOK);
      await webhooks.getByLabel("Description", { exact: true }).fill(`e2e ${run}`);
      await webhooks.getByRole("button", { name: "Add endpoint" }).click();
      const shown = webhooks.getByRole("region", { name: "New webhook secret" });
      await expect(shown.locator("pre code")).toHaveText(/^whsec_\S+$/);
      const secret = (await shown.locator("pre code").textContent())!.trim();
      await shown.getByRole("button", { name: "Done, I have stored it" }).click();
      await expect(shown).toHaveCount(0);
      expect(await page.content(), "the secret is shown once").not.toContain(secret);

      const row = webhooks.getByRole("row").filter({ hasText: HOOK }).first();
      await expect(row).toContainText("job.succeeded");
      await webhooks.getByRole("button", { name: `Send a test event to ${HOOK}` }).click();
      const log = webhooks.getByRole("region", { name: `Deliveries of ${HOOK}` });
      const delivery = log.getByRole("listitem").filter({ hasText: "webhook.test" });
      await expect(delivery).toHaveCount(1);
      // The worker's first attempt; the next is 5 s later (SPECDECK_WEBHOOK_RETRY_SECONDS).
      await expect(delivery.getByRole("table", { name: /^Attempts of / }).getByRole("row").nth(1)).toContainText(
        /connection refused/i,
      );
      await screenshotSizes(page, webhooks, "settings-webhooks");

      acceptNextDialog(page);
      await webhooks.getByRole("button", { name: `Delete webhook ${HOOK}` }).click();
      await expect(webhooks.getByRole("row").filter({ hasText: HOOK })).toHaveCount(0);
    });
  });

  test("a page for something that does not exist", async () => {
    await test.step("14b. a deployment id that does not exist: not found, nothing to try again", async () => {
      await page.goto("/deployments/dep_000000000000000000000000");
      const alert = page.getByRole("alert");
      await expect(alert).toContainText("Not found.");
      await expect(alert).toContainText("dep_000000000000000000000000");
      await expect(alert).not.toContainText("Something went wrong");
      await expect(alert.getByRole("button", { name: "Try again" })).toHaveCount(0);
      await page.screenshot({ path: screenshotPath("missing-deployment", 1280, 800), fullPage: true });
    });
  });

  test("the keys", async () => {
    await test.step("18. revoking the key in use signs this browser out", async () => {
      await page.goto("/settings");
      const keys = page.getByRole("region", { name: "API keys" });
      await keys.getByLabel("Key name", { exact: true }).fill(`e2e-${run}`);
      // The project's next admin key: a project keeps at least one (a member key can't manage it).
      await expect(keys.getByLabel("Role", { exact: true })).toHaveValue("member");
      await keys.getByLabel("Role", { exact: true }).selectOption("admin");
      await keys.getByRole("button", { name: "Create key" }).click();
      const shown = page.locator('[aria-label="New API key"]');
      await expect(shown.locator("pre code")).toHaveText(/^sdk-\S+$/);
      const created = (await shown.locator("pre code").textContent())?.trim();
      expect(created, "the new key's plaintext is shown once").toBeTruthy();
      saveState({ key: created }); // the project keeps a key; pages.spec.ts signs in with it

      await expect(keys.getByRole("row").filter({ hasText: `e2e-${run}` })).toContainText("admin");
      const mine = keys.getByRole("row").filter({ hasText: "this browser" });
      await expect(mine).toHaveCount(1);
      acceptNextDialog(page);
      await mine.getByRole("button", { name: /^Revoke key / }).click();
      await expect(page).toHaveURL(/\/sign-in$/);
      await expect(page.getByLabel("API key", { exact: true })).toBeVisible();
    });
  });
});
