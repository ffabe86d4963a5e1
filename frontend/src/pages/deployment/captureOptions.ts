// The `capture` option of New deployment as the form holds it (text per field), its checks
// (the limits of app/schemas/capture.py CaptureOptions) and the body it becomes.
import type { CaptureOptions } from "../../api/client";

const MIB = 1024 * 1024;
export const LIMITS = {
  sample_rate: { min: 0, max: 1 }, // 0 excluded
  max_rows: { min: 1, max: 10_000_000 },
  max_mib: { min: 1, max: 64 * 1024 }, // max_bytes: 1 KiB to 64 GiB, asked in MiB
  retention_days: { min: 1, max: 3650 },
};

export interface CaptureForm {
  on: boolean;
  sample_rate: string;
  max_rows: string;
  max_mib: string;
  retention_days: string;
}

/** The API's defaults: 10 % of requests, up to 100,000 rows or 1 GiB, each kept 30 days. */
export const CAPTURE_DEFAULTS: CaptureForm = {
  on: false,
  sample_rate: "0.1",
  max_rows: "100000",
  max_mib: "1024",
  retention_days: "30",
};

/** The form's field names are the API's (errors come back at `capture.<name>`). */
export const CAPTURE_FIELDS = ["sample_rate", "max_rows", "max_bytes", "retention_days"];

const whole = (text: string, min: number, max: number) =>
  /^\d+$/.test(text.trim()) && Number(text) >= min && Number(text) <= max;

export function validateCapture(form: CaptureForm): Record<string, string> {
  const e: Record<string, string> = {};
  if (!form.on) return e;
  const rate = Number(form.sample_rate);
  if (!form.sample_rate.trim() || !(rate > 0 && rate <= 1))
    e.sample_rate = "A share of requests above 0 and at most 1 (0.1 = 10 %)";
  if (!whole(form.max_rows, LIMITS.max_rows.min, LIMITS.max_rows.max))
    e.max_rows = `A whole number from ${LIMITS.max_rows.min} to ${LIMITS.max_rows.max.toLocaleString("en-US")}`;
  if (!whole(form.max_mib, LIMITS.max_mib.min, LIMITS.max_mib.max))
    e.max_bytes = `A whole number of MiB from ${LIMITS.max_mib.min} to ${LIMITS.max_mib.max.toLocaleString("en-US")}`;
  if (!whole(form.retention_days, LIMITS.retention_days.min, LIMITS.retention_days.max))
    e.retention_days = `A whole number of days from ${LIMITS.retention_days.min} to ${LIMITS.retention_days.max}`;
  return e;
}

export function captureBody(form: CaptureForm): CaptureOptions | null {
  if (!form.on) return null;
  return {
    sample_rate: Number(form.sample_rate),
    max_rows: Number(form.max_rows),
    max_bytes: Number(form.max_mib) * MIB,
    retention_days: Number(form.retention_days),
  };
}
