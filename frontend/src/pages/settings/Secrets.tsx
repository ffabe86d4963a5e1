// Project secrets (HF_TOKEN ...): names and dates only. A value is typed into an uncontrolled
// password field, read at the moment it is sent, and cleared once saved: it never enters React
// state, a mutation's variables or the query cache, and the API never returns it.
import { ConfirmAction } from "../../components/confirm";
import { useRef, useState, type FormEvent } from "react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type Secret } from "../../api/client";
import { Field, FormError, described, useFieldErrors } from "../../components/form";
import { QueryState } from "../../components/states";
import { RelTime } from "../../components/time";

// app/services/secrets.py NAME and app/schemas/secrets.py SecretPut.value.
const NAME = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;
const NAME_RULE = "1-64 letters, digits and underscores, not starting with a digit";
const VALUE_MAX = 8192;

function SecretRow({ secret }: { secret: Secret }) {
  const queryClient = useQueryClient();
  const remove = useMutation({
    mutationFn: () => must(api.DELETE("/api/secrets/{name}", { params: { path: { name: secret.name } } })),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["secrets"] }),
  });
  return (
    <tr>
      <td className="mono">{secret.name}</td>
      <td className="hide-narrow">
        <RelTime at={secret.created_at} />
      </td>
      <td>
        <RelTime at={secret.updated_at} />
      </td>
      <td>
        <ConfirmAction
          label="Delete"
          name={`Delete secret ${secret.name}`}
          question={`Delete secret ${secret.name}? Jobs that need it will fail until it is set again.`}
          action={remove}
        />
      </td>
    </tr>
  );
}

function SaveSecret() {
  const [name, setName] = useState("HF_TOKEN");
  const [saved, setSaved] = useState<string | null>(null);
  const valueRef = useRef<HTMLInputElement>(null);
  const { errors, setErrors, formError, fromError, clear } = useFieldErrors(["name", "value"]);
  const queryClient = useQueryClient();
  const save = useMutation({
    // No variables: the value is read from the field here, so no cache ever holds it.
    mutationFn: () =>
      must(
        api.PUT("/api/secrets/{name}", {
          params: { path: { name } },
          body: { value: valueRef.current?.value ?? "" },
        }),
      ),
    onSuccess: (secret) => {
      if (valueRef.current) valueRef.current.value = "";
      setSaved(secret.name);
      queryClient.invalidateQueries({ queryKey: ["secrets"] });
    },
    onError: fromError,
  });

  function submit(event: FormEvent) {
    event.preventDefault();
    clear();
    setSaved(null);
    const value = valueRef.current?.value ?? "";
    const next: Record<string, string> = {};
    if (!NAME.test(name)) next.name = `A secret name is ${NAME_RULE}`;
    if (value.length === 0) next.value = "Enter the secret's value";
    else if (value.length > VALUE_MAX) next.value = `A value has at most ${VALUE_MAX} characters`;
    if (Object.keys(next).length) return setErrors(next);
    save.mutate();
  }

  return (
    <form onSubmit={submit} className="card" aria-label="Save a secret" noValidate>
      <h3>Set a secret</h3>
      <Field id="secret-name" label="Secret name" error={errors.name} hint={NAME_RULE}>
        <input
          {...described("secret-name", errors.name, true)}
          value={name}
          maxLength={64}
          autoComplete="off"
          spellCheck={false}
          onChange={(e) => setName(e.target.value)}
        />
      </Field>
      <Field
        id="secret-value"
        label="Secret value"
        error={errors.value}
        hint="Stored encrypted; it is never shown again. Saving a name that exists replaces its value."
      >
        <input
          {...described("secret-value", errors.value, true)}
          ref={valueRef}
          type="password"
          autoComplete="off"
          spellCheck={false}
          maxLength={VALUE_MAX}
        />
      </Field>
      <FormError message={formError} />
      <div className="actions">
        <button type="submit" className="primary" disabled={save.isPending}>
          {save.isPending ? "Saving…" : "Save secret"}
        </button>
        {saved && (
          <span role="status" className="dim">
            Saved {saved}.
          </span>
        )}
      </div>
    </form>
  );
}

export default function Secrets() {
  const secrets = useQuery({
    queryKey: ["secrets"],
    queryFn: () => must(api.GET("/api/secrets")),
  });
  return (
    <section aria-label="Secrets" className="settings-section">
      <h2>Secrets</h2>
      <p className="hint">
        Values the workers hand to jobs, such as <code>HF_TOKEN</code> for gated models and for publishing to the
        Hugging Face Hub. Only names and dates are listed: values are never shown.
      </p>
      <div className="split">
        <QueryState
          query={secrets}
          what="Loading secrets"
          isEmpty={(page) => page.data.length === 0}
          empty={<p>No secrets yet. Set HF_TOKEN to use gated models or publish to the Hub.</p>}
        >
          {(page) => (
            <div className="table-wrap">
              <table aria-label="Secret names">
                <thead>
                  <tr>
                    <th>Name</th>
                    <th className="hide-narrow">Created</th>
                    <th>Updated</th>
                    <th>
                      <span className="sr-only">Actions</span>
                    </th>
                  </tr>
                </thead>
                <tbody>
                  {page.data.map((s) => (
                    <SecretRow key={s.name} secret={s} />
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </QueryState>
        <SaveSecret />
      </div>
    </section>
  );
}
