// New deployment's "Traffic capture" section: off unless ticked; the API's defaults filled in.
import type { ChangeEvent } from "react";
import { Field, described } from "../../components/form";
import { LIMITS, type CaptureForm } from "./captureOptions";

export function CaptureFields({
  value,
  onChange,
  errors,
}: {
  value: CaptureForm;
  onChange: (next: CaptureForm) => void;
  errors: Record<string, string>;
}) {
  const set = (name: keyof CaptureForm) => (e: ChangeEvent<HTMLInputElement>) =>
    onChange({ ...value, [name]: e.target.value });
  return (
    <fieldset>
      <legend>Traffic capture</legend>
      <label className="check">
        <input type="checkbox" checked={value.on} onChange={(e) => onChange({ ...value, on: e.target.checked })} />
        Capture a sample of the requests
      </label>
      <p className="hint capture-intro">
        Sampled requests (their messages and final reply) are recorded into a dataset of this project, encrypted at
        rest, for a retrain on your own traffic. Capture never slows a request: when it cannot keep up, it drops rows
        and counts them.
      </p>
      {value.on && (
        <div className="grid2 capture-fields">
          <Field id="dep-sample_rate" label="Sample rate" error={errors.sample_rate} hint="The share of requests recorded: 0.1 is 10 % (default).">
            <input
              {...described("dep-sample_rate", errors.sample_rate, true)}
              type="number"
              inputMode="decimal"
              min={LIMITS.sample_rate.min}
              max={LIMITS.sample_rate.max}
              step="any"
              value={value.sample_rate}
              onChange={set("sample_rate")}
            />
          </Field>
          <Field id="dep-max_rows" label="Max rows" error={errors.max_rows} hint="Beyond it, sampled requests are dropped (default 100,000).">
            <input
              {...described("dep-max_rows", errors.max_rows, true)}
              type="number"
              inputMode="numeric"
              min={LIMITS.max_rows.min}
              max={LIMITS.max_rows.max}
              step={1}
              value={value.max_rows}
              onChange={set("max_rows")}
            />
          </Field>
          <Field id="dep-max_bytes" label="Max size (MiB)" error={errors.max_bytes} hint="Of the rows' JSON, before encryption (default 1024 MiB = 1 GiB).">
            <input
              {...described("dep-max_bytes", errors.max_bytes, true)}
              type="number"
              inputMode="numeric"
              min={LIMITS.max_mib.min}
              max={LIMITS.max_mib.max}
              step={1}
              value={value.max_mib}
              onChange={set("max_mib")}
            />
          </Field>
          <Field id="dep-retention_days" label="Retention (days)" error={errors.retention_days} hint="Older rows are deleted (default 30).">
            <input
              {...described("dep-retention_days", errors.retention_days, true)}
              type="number"
              inputMode="numeric"
              min={LIMITS.retention_days.min}
              max={LIMITS.retention_days.max}
              step={1}
              value={value.retention_days}
              onChange={set("retention_days")}
            />
          </Field>
        </div>
      )}
    </fieldset>
  );
}
