import { useState, type FormEvent } from "react";
import { useNavigate, useLocation } from "react-router-dom";
import { session } from "../api/session";
import { ApiError, messageOf } from "../api/errors";
import { whoIs, useAuth } from "../auth";
import { Field, described } from "../components/form";

export default function SignIn() {
  const [key, setKey] = useState("");
  const [remember, setRemember] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const navigate = useNavigate();
  const location = useLocation();
  const { identity, key: current } = useAuth();
  const next = (location.state as { from?: string } | null)?.from ?? "/jobs";

  async function submit(event: FormEvent) {
    event.preventDefault();
    const value = key.trim();
    if (!value) return setError("Paste an API key");
    setBusy(true);
    setError(null);
    try {
      await whoIs(value);
      session.signIn(value, remember);
      setKey("");
      navigate(next, { replace: true });
    } catch (e) {
      setError(e instanceof ApiError && e.status === 401 ? "That key is not valid (or it was revoked)." : messageOf(e));
    } finally {
      setBusy(false);
    }
  }

  return (
    <main className="signin">
      <h1>SpecDeck</h1>
      <p className="lead">Train, evaluate and serve DFlash drafters.</p>
      {current && identity && (
        <p className="state" role="status">
          Signed in to project <strong>{identity.project.name}</strong> with key {identity.key.prefix}…
        </p>
      )}
      <form onSubmit={submit} className="card" noValidate>
        <h2>Sign in</h2>
        <Field
          id="api-key"
          label="API key"
          error={error ?? undefined}
          hint={
            <>
              From <code>specdeck admin keys create</code> or <code>specdeck keys create</code>, or printed by <code>make run</code>. It is kept in this browser
              only and sent as a Bearer token.
            </>
          }
        >
          <input
            {...described("api-key", error ?? undefined, true)}
            type="password"
            autoComplete="off"
            spellCheck={false}
            value={key}
            onChange={(e) => setKey(e.target.value)}
            autoFocus
          />
        </Field>
        <label className="check">
          <input type="checkbox" checked={remember} onChange={(e) => setRemember(e.target.checked)} /> Stay signed in
          on this browser
        </label>
        <button type="submit" className="primary" disabled={busy}>
          {busy ? "Checking…" : "Sign in"}
        </button>
      </form>
    </main>
  );
}
