// A new user's first hour (issue 59): on this CPU-only stack with `specdeck run`'s demo verifier
// the new job form opens on settings a CPU can train; the jobs list shows what a drafter is
// chosen by, its served speedup, and sorts by it; a disabled action says why in text, at phone
// width too. Runs after flow.spec.ts, beside verdict.spec.ts's slower copy (SPECDECK_SLOW_JOB).
import { expect, test, type Page } from "@playwright/test";
import { env, readState, screenshotPath, signIn } from "./support";

const PHONE = { width: 390, height: 844 };

async function speedups(page: Page): Promise<(number | null)[]> {
  const cells = await page.getByRole("table", { name: "Jobs" }).getByTestId("job-speedup").allTextContents();
  return cells.map((text) => (text.startsWith("×") ? Number.parseFloat(text.slice(1)) : null));
}

test.beforeEach(async ({ page }) => {
  await signIn(page, readState().key ?? env("SPECDECK_KEY"));
});

test("the new job form opens with the demo settings on a CPU-only stack", async ({ page }) => {
  for (const size of [{ width: 1280, height: 800 }, PHONE]) {
    await page.setViewportSize(size);
    await page.goto("/jobs/new");
    await expect(page.getByTestId("cpu-defaults")).toContainText("No worker offers a GPU");
    const verifier = page.getByLabel("Verifier", { exact: true });
    await expect(verifier).toHaveValue("demo");
    // Offered: the models under the models root (the demo verifier), as a list and in words.
    const offered = page.getByTestId("local-verifiers").locator("option");
    await expect(offered).toHaveCount(1);
    await expect(offered).toHaveAttribute("value", "demo");
    await expect(page.getByLabel("Runtime", { exact: true })).toHaveValue("local");
    await expect(page.getByLabel("Epochs", { exact: true }).first()).toHaveValue("2");
    // No GPU fields where no worker offers GPUs, whatever the runtime chosen.
    await page.getByLabel("Runtime", { exact: true }).selectOption("vllm");
    await expect(page.getByText("Trainer GPUs")).toHaveCount(0);
    await expect(page.getByTestId("local-resources")).toContainText("No worker offers GPUs now");
    await page.screenshot({ path: screenshotPath("new-job-cpu-defaults", size.width, size.height), fullPage: true });
  }
});

test("the jobs list shows each job's served speedup, and sorts by it", async ({ page }) => {
  const slowId = env("SPECDECK_SLOW_JOB");
  await page.goto("/jobs");
  const slow = page.getByRole("row").filter({ has: page.getByRole("link", { name: slowId }) });
  await expect(slow.getByTestId("job-speedup")).toHaveText(/^×0\.61( ±0\.04)?$/);
  const header = page.getByRole("columnheader", { name: /Speedup/ });
  await header.getByRole("button").click();
  await expect(header).toHaveAttribute("aria-sort", "descending");
  await expect(page).toHaveURL(/[?&]sort=speedup\b/);
  const down = await speedups(page);
  const measured = down.filter((s): s is number => s !== null);
  expect(measured.length, "the flow's job and the slower copy are measured").toBeGreaterThanOrEqual(2);
  expect(measured, "highest first").toEqual([...measured].sort((a, b) => b - a));
  expect(down.slice(0, measured.length), "those not measured last").toEqual(measured);
  await header.getByRole("button").click();
  await expect(header).toHaveAttribute("aria-sort", "ascending");
  const up = (await speedups(page)).filter((s): s is number => s !== null);
  expect(up, "lowest first").toEqual([...measured].sort((a, b) => a - b));
  await page.getByRole("table", { name: "Jobs" }).screenshot({ path: screenshotPath("jobs-by-speedup", 1280, 800) });
});

test("a disabled action says why in text, at phone width", async ({ page }) => {
  await page.setViewportSize(PHONE);
  await page.goto("/jobs");
  const compare = page.getByRole("button", { name: /^Compare/ });
  await page.getByRole("checkbox", { name: /^Compare / }).first().check();
  await expect(compare).toBeDisabled();
  await expect(page.getByText("Tick one more job to compare.")).toBeVisible();
  // A deployment's roll back, where it has nothing to roll back to.
  const { deploymentId } = readState();
  if (deploymentId) {
    await page.goto(`/deployments/${deploymentId}`);
    const rollBack = page.getByRole("button", { name: /^Roll back deployment/ });
    if ((await rollBack.count()) && (await rollBack.isDisabled())) {
      await expect(page.getByTestId("unavailable").first()).toBeVisible();
      await expect(page.getByTestId("unavailable").first()).toContainText(/\w/);
    }
  }
  await page.screenshot({ path: screenshotPath("disabled-reasons", PHONE.width, PHONE.height), fullPage: true });
});
