// Shared by the e2e specs: the environment, signing in through the form, and a small state file
// that flow.spec.ts leaves for pages.spec.ts (the job and deployment it made, and the key that
// is still valid after it revoked SPECDECK_KEY).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { expect, type Page } from "@playwright/test";

export function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/e2e/test_dashboard.py sets it)`);
  return value;
}

export const ARTIFACTS = path.resolve(process.env.SPECDECK_ARTIFACTS ?? "test-results");

export function screenshotPath(page: string, width: number, height: number): string {
  return path.join(ARTIFACTS, "screenshots", `${page}-${width}x${height}.png`);
}

export interface FlowState {
  jobId?: string;
  deploymentId?: string;
  key?: string; // a key of the project that flow.spec.ts did not revoke
}

const STATE =
  process.env.SPECDECK_E2E_STATE ??
  path.join(os.tmpdir(), `specdeck-e2e-${new URL(process.env.SPECDECK_URL ?? "http://x").port || "80"}.json`);

export function readState(): FlowState {
  try {
    return JSON.parse(fs.readFileSync(STATE, "utf8")) as FlowState;
  } catch {
    return {};
  }
}

export function saveState(update: Partial<FlowState>): void {
  fs.writeFileSync(STATE, JSON.stringify({ ...readState(), ...update }), { mode: 0o600 });
}

export function clearState(): void {
  fs.rmSync(STATE, { force: true });
}

/** Sign in as a user does: the form on /sign-in, then the jobs page. */
export async function signIn(page: Page, key: string, { remember = false } = {}): Promise<void> {
  await page.goto("/sign-in");
  await page.getByLabel("API key", { exact: true }).fill(key);
  if (remember) await page.getByLabel(/stay signed in/i).check();
  await page.getByRole("button", { name: "Sign in" }).click();
  await expect(page).toHaveURL(/\/jobs$/);
  await expect(page.getByRole("button", { name: "Sign out" })).toBeVisible();
}

/** Accept the next window.confirm (deleting, cancelling, revoking). */
export function acceptNextDialog(page: Page): void {
  page.once("dialog", (dialog) => void dialog.accept());
}

/** Fill a field only when the form has exactly one with this label (optional form fields). */
export async function fillIfPresent(page: Page, label: RegExp, value: string): Promise<boolean> {
  const field = page.getByLabel(label);
  if ((await field.count()) !== 1 || !(await field.isVisible()) || !(await field.isEditable())) return false;
  await field.fill(value);
  return true;
}
