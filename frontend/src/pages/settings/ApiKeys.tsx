// The project's API keys. A new key's plaintext is shown once: it lives in this component's
// state only (the creating mutation is dropped from TanStack's cache at once) and is gone when
// the user dismisses it or leaves the page. Revoking the key this browser uses signs out.
import { ConfirmAction } from "../../components/confirm";
import { useState, type FormEvent } from "react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type ApiKey } from "../../api/client";
import { session } from "../../api/session";
import { useAuth } from "../../auth";
import { Field, FormError, described, useFieldErrors } from "../../components/form";
import { ShownOnce } from "../../components/once";
import { Pager, useCursor } from "../../components/pager";
import { QueryState } from "../../components/states";
import { RelTime } from "../../components/time";

const NAME_MAX = 100; // app/schemas/keys.py KeyCreate.name
type Role = ApiKey["role"];
// What each role may do (app/api/deps.py): shown beside the choice and in the table.
const ROLES: { role: Role; what: string }[] = [
  { role: "admin", what: "everything, keys, secrets and webhooks included" },
  { role: "member", what: "train, deploy and chat; not keys, secrets or webhooks" },
  { role: "inference", what: "the OpenAI-compatible /v1 alone: for an application that chats" },
];

/** Whether this browser signs in with `key`: by the identity /api/me gives, else by prefix. */
function useIsCurrent(): (key: ApiKey) => boolean {
  const { identity } = useAuth();
  const mine = session.key();
  return (key) => (identity ? identity.key.id === key.id : mine !== null && mine.startsWith(key.prefix));
}

function KeyRow({ apiKey, current }: { apiKey: ApiKey; current: boolean }) {
  const queryClient = useQueryClient();
  const { signOut } = useAuth();
  const revoke = useMutation({
    mutationFn: () => must(api.DELETE("/api/keys/{key_id}", { params: { path: { key_id: apiKey.id } } })),
    onSuccess: () => {
      if (current) signOut(); // the next request would 401 anyway; go to sign-in now
      else queryClient.invalidateQueries({ queryKey: ["keys"] });
    },
  });
  const label = apiKey.name || <span className="dim">(no name)</span>;
  return (
    <tr className={apiKey.revoked_at ? "revoked" : undefined}>
      <td>
        <strong>{label}</strong>
        {current && <span className="badge busy this-browser">this browser</span>}
        <div className="mono dim">{apiKey.prefix}…</div>
      </td>
      <td>
        <span className="badge muted" title={ROLES.find((r) => r.role === apiKey.role)?.what}>
          {apiKey.role}
        </span>
      </td>
      <td className="hide-narrow">
        <RelTime at={apiKey.created_at} />
      </td>
      <td className="hide-narrow">{apiKey.last_used_at ? <RelTime at={apiKey.last_used_at} /> : "never"}</td>
      <td>
        {apiKey.revoked_at ? (
          <span className="badge muted">
            revoked <RelTime at={apiKey.revoked_at} />
          </span>
        ) : (
          <span className="badge good">active</span>
        )}
      </td>
      <td>
        {!apiKey.revoked_at && (
          <ConfirmAction
            label="Revoke"
            name={`Revoke key ${apiKey.prefix}`}
            question={
              current
                ? `Revoke key ${apiKey.prefix}…? This browser signs in with it: you will be signed out at once.`
                : `Revoke key ${apiKey.prefix}…? Anything using it is refused from now on.`
            }
            action={revoke}
          />
        )}
      </td>
    </tr>
  );
}

function CreateKey() {
  const [name, setName] = useState("");
  const [role, setRole] = useState<Role>("member");
  const [plaintext, setPlaintext] = useState<string | null>(null);
  const { errors, setErrors, formError, fromError, clear } = useFieldErrors(["name", "role"]);
  const queryClient = useQueryClient();
  const create = useMutation({
    mutationFn: (body: { name: string; role: Role }) => must(api.POST("/api/keys", { body })),
    gcTime: 0, // with reset() below, the answer (the plaintext) leaves TanStack's cache at once
    onSuccess: (created) => {
      setPlaintext(created.key);
      setName("");
      create.reset();
      queryClient.invalidateQueries({ queryKey: ["keys"] });
    },
    onError: fromError,
  });

  function submit(event: FormEvent) {
    event.preventDefault();
    clear();
    setPlaintext(null);
    const trimmed = name.trim();
    if (trimmed.length > NAME_MAX) return setErrors({ name: `A key name has at most ${NAME_MAX} characters` });
    create.mutate({ name: trimmed, role });
  }

  return (
    <form onSubmit={submit} className="card" aria-label="Create an API key" noValidate>
      <h3>Create a key</h3>
      <Field id="key-name" label="Key name" error={errors.name} hint="Optional: a label to tell keys apart.">
        <input
          {...described("key-name", errors.name, true)}
          value={name}
          maxLength={NAME_MAX}
          autoComplete="off"
          onChange={(e) => setName(e.target.value)}
        />
      </Field>
      <Field
        id="key-role"
        label="Role"
        error={errors.role}
        hint={ROLES.find((r) => r.role === role)?.what}
      >
        <select {...described("key-role", errors.role, true)} value={role} onChange={(e) => setRole(e.target.value as Role)}>
          {ROLES.map((r) => (
            <option key={r.role} value={r.role}>
              {r.role}
            </option>
          ))}
        </select>
      </Field>
      <FormError message={formError} />
      <button type="submit" className="primary" disabled={create.isPending}>
        {create.isPending ? "Creating…" : "Create key"}
      </button>
      {plaintext && (
        <ShownOnce name="New API key" label="API key" text={plaintext} onDismiss={() => setPlaintext(null)}>
          <strong>Store this key now: it will not be shown again.</strong> SpecDeck keeps only its hash.
        </ShownOnce>
      )}
    </form>
  );
}

export default function ApiKeys() {
  const cursor = useCursor();
  const isCurrent = useIsCurrent();
  const keys = useQuery({
    queryKey: ["keys", cursor.after],
    queryFn: () => must(api.GET("/api/keys", { params: { query: { limit: 20, after: cursor.after } } })),
  });
  return (
    <section aria-label="API keys" className="settings-section">
      <h2>API keys</h2>
      <p className="hint">
        Keys of this project, for the dashboard, the API and the OpenAI-compatible gateway (<code>/v1</code>). A
        revoked key is refused at once.
      </p>
      <div className="split">
        <QueryState
          query={keys}
          what="Loading keys"
          isEmpty={(page) => page.data.length === 0}
          empty={<p>No keys on this page.</p>}
        >
          {(page) => (
            <>
              <div className="table-wrap">
                <table aria-label="Keys">
                  <thead>
                    <tr>
                      <th>Key</th>
                      <th>Role</th>
                      <th className="hide-narrow">Created</th>
                      <th className="hide-narrow">Last used</th>
                      <th>State</th>
                      <th>
                        <span className="sr-only">Actions</span>
                      </th>
                    </tr>
                  </thead>
                  <tbody>
                    {page.data.map((k) => (
                      <KeyRow key={k.id} apiKey={k} current={isCurrent(k)} />
                    ))}
                  </tbody>
                </table>
              </div>
              <Pager cursor={cursor} hasMore={page.has_more} lastId={page.last_id} />
            </>
          )}
        </QueryState>
        <CreateKey />
      </div>
    </section>
  );
}
