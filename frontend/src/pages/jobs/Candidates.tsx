// The New job form's bake-off: candidate rows (a kind, a name and the settings that commonly
// differ), added and removed; each empty field takes the speculator's setting, which the field
// shows as its placeholder. A row's errors (client checks, or the API's at candidates.<i>.<field>)
// are shown at its fields, or on the row for a field it does not show.
import type { ReactNode } from "react";
import { Field, described } from "../../components/form";
import {
  CANDIDATE_FIELDS,
  KINDS,
  candidateParam,
  fieldId,
  isBlockKind,
  newCandidate,
  type CandidateForm,
  type CandidateKey,
  type JobForm,
  type Kind,
} from "./form";

/** The speculator's value a candidate's empty field takes (or the kind's own default, where the
 * speculator's kind lacks the field). */
function inherited(form: JobForm, kind: Kind, key: CandidateKey): string {
  if (key === "blockSize") return isBlockKind(form.kind) ? form.blockSize : kind === "dflash" ? "16" : "8";
  if (key === "numLayers") return form.numLayers;
  if (key === "epochs") return form.epochs;
  if (key === "lr") return form.lr;
  return "";
}

export function kindOption(kind: (typeof KINDS)[number]): string {
  return `${kind.kind} (${kind.label}${kind.cpu ? "" : ", GPU only: vllm runtime"})`;
}

function Row({
  form,
  index,
  candidate,
  errorOf,
  onChange,
  onRemove,
}: {
  form: JobForm;
  index: number;
  candidate: CandidateForm;
  errorOf: (param: string) => string | undefined;
  onChange: (next: CandidateForm) => void;
  onRemove: () => void;
}) {
  const n = index + 1;
  const rowError = errorOf(`candidates.${index}`);

  function input(key: Exclude<CandidateKey, "kind">, props: { numeric?: boolean; placeholder?: string } = {}): ReactNode {
    const param = candidateParam(index, key);
    const id = fieldId(param);
    const error = errorOf(param);
    const { label } = CANDIDATE_FIELDS[key];
    return (
      <div className={`f-${key}`}>
      <Field id={id} label={<>{label}<span className="sr-only"> of candidate {n}</span></>} error={error}>
        <input
          {...described(id, error)}
          value={candidate[key]}
          placeholder={props.placeholder ?? inherited(form, candidate.kind, key)}
          inputMode={props.numeric ? (key === "lr" ? "decimal" : "numeric") : undefined}
          autoComplete="off"
          spellCheck={false}
          onChange={(e) => onChange({ ...candidate, [key]: e.target.value })}
        />
      </Field>
      </div>
    );
  }

  const kindId = fieldId(candidateParam(index, "kind"));
  const kindError = errorOf(candidateParam(index, "kind"));
  const extra = Object.entries(candidate.extra);
  return (
    <li className={`candidate-row${rowError ? " invalid" : ""}`}>
      <fieldset aria-label={`Candidate ${n}`}>
        <legend>Candidate {n}</legend>
        <div className="candidate-fields">
          <div className="f-kind">
          <Field id={kindId} label={<>Kind<span className="sr-only"> of candidate {n}</span></>} error={kindError}>
            <select
              {...described(kindId, kindError)}
              value={candidate.kind}
              onChange={(e) => onChange({ ...candidate, kind: e.target.value as Kind })}
            >
              {KINDS.map((k) => (
                <option key={k.kind} value={k.kind}>
                  {kindOption(k)}
                </option>
              ))}
            </select>
          </Field>
          </div>
          {input("name", { placeholder: candidate.kind })}
          {isBlockKind(candidate.kind) ? (
            input("blockSize", { numeric: true })
          ) : (
            <p className="f-blockSize hint no-block">no block size: {candidate.kind} drafts token by token</p>
          )}
          {input("numLayers", { numeric: true })}
          {input("epochs", { numeric: true })}
          {input("lr", { numeric: true })}
          <div className="f-remove">
            <button type="button" className="small danger" aria-label={`Remove candidate ${n}`} onClick={onRemove}>
              Remove
            </button>
          </div>
        </div>
        {extra.length > 0 && (
          <p className="hint">
            Also sets, as the cloned job's did: {extra.map(([k, v]) => `${k} ${JSON.stringify(v)}`).join(", ")}
          </p>
        )}
        {rowError && (
          <div className="field-error" role="alert" id={fieldId(`candidates.${index}`)}>
            {rowError}
          </div>
        )}
      </fieldset>
    </li>
  );
}

export function CandidateRows({
  form,
  errorOf,
  onChange,
}: {
  form: JobForm;
  errorOf: (param: string) => string | undefined;
  onChange: (candidates: CandidateForm[]) => void;
}) {
  const listError = errorOf("candidates");
  const rows = form.candidates;
  return (
    <div className="candidates">
      <p className="hint" id="candidates-hint">
        {rows.length === 0
          ? "None: the job trains the drafter above. Add candidates to train several drafters on the same data, serve them side by side and keep the fastest lossless one."
          : `${rows.length} candidate${rows.length === 1 ? "" : "s"}, trained one after another and ranked by served speedup. An empty field takes the setting above (shown greyed); the sequence length is shared.`}
      </p>
      {listError && (
        <div className="field-error" role="alert">
          {listError}
        </div>
      )}
      {rows.length > 0 && (
        <ol className="candidate-list">
          {rows.map((c, i) => (
            <Row
              key={c.key}
              form={form}
              index={i}
              candidate={c}
              errorOf={errorOf}
              onChange={(next) => onChange(rows.map((r) => (r.key === c.key ? next : r)))}
              onRemove={() => onChange(rows.filter((r) => r.key !== c.key))}
            />
          ))}
        </ol>
      )}
      <button
        type="button"
        className="small"
        onClick={() => onChange([...rows, newCandidate(rows.length === 0 ? form.kind : "dflash")])}
      >
        Add candidate
      </button>
    </div>
  );
}
