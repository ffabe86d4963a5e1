// The project's webhooks: endpoints its events are POSTed to, signed with a secret that is shown
// once, when the endpoint is created. Like a new API key, the secret lives in this component's
// state only (the creating mutation is dropped from TanStack's cache at once). Each endpoint has
// its delivery log, and a button that sends it a test event.
import { ConfirmAction } from "../../components/confirm";
import { useState, type FormEvent } from "react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type Webhook, type WebhookEvent } from "../../api/client";
import { messageOf } from "../../api/errors";
import { Field, FormError, described, useFieldErrors } from "../../components/form";
import { ShownOnce } from "../../components/once";
import { Pager, useCursor } from "../../components/pager";
import { QueryState } from "../../components/states";
import { RelTime } from "../../components/time";
import WebhookDeliveries from "./WebhookDeliveries";

// app/schemas/webhooks.py WebhookCreate.
const URL_MAX = 2048;
const DESCRIPTION_MAX = 500;

/** Every event a webhook can subscribe to: a Record over the schema's union, so that an event
 * added to (or dropped from) the API fails the type-check until it is listed here. */
const EVENTS: Record<WebhookEvent, string> = {
  "job.succeeded": "a job finished",
  "job.failed": "a job failed",
  "job.cancelled": "a job was cancelled",
  "checkpoint.published": "a checkpoint is on the Hub",
  "deployment.ready": "a deployment serves",
  "deployment.failed": "a deployment failed",
  "deployment.acceptance_dropped": "a deployment's live acceptance dropped",
  "deployment.promotion_succeeded": "a promotion or rollback switched every replica",
  "deployment.promotion_failed": "a promotion or rollback failed (the old drafter serves on)",
};
const EVENT_NAMES = Object.keys(EVENTS) as WebhookEvent[];

function WebhookRow({ webhook }: { webhook: Webhook }) {
  const [open, setOpen] = useState(false);
  const queryClient = useQueryClient();
  const remove = useMutation({
    mutationFn: () =>
      must(api.DELETE("/api/webhooks/{webhook_id}", { params: { path: { webhook_id: webhook.id } } })),
    onSuccess: () => {
      queryClient.removeQueries({ queryKey: ["webhook-deliveries", webhook.id] });
      queryClient.invalidateQueries({ queryKey: ["webhooks"] });
    },
  });
  const test = useMutation({
    mutationFn: () =>
      must(api.POST("/api/webhooks/{webhook_id}/test", { params: { path: { webhook_id: webhook.id } } })),
    onSuccess: () => {
      setOpen(true);
      queryClient.invalidateQueries({ queryKey: ["webhook-deliveries", webhook.id] });
    },
  });
  const logId = `deliveries-${webhook.id}`;
  return (
    <>
      <tr>
        <td className="endpoint">
          <div className="mono url">{webhook.url}</div>
          {webhook.description && <div>{webhook.description}</div>}
          <ul className="events" aria-label="Events">
            {webhook.events.map((e) => (
              <li key={e}>
                <code>{e}</code>
              </li>
            ))}
          </ul>
        </td>
        <td className="hide-narrow">
          <RelTime at={webhook.created_at} />
        </td>
        <td>
          <div className="row-actions">
            <button
              type="button"
              className="small"
              aria-expanded={open}
              aria-controls={logId}
              aria-label={`Deliveries of ${webhook.url}`}
              onClick={() => setOpen(!open)}
            >
              {open ? "Hide deliveries" : "Deliveries"}
            </button>
            <button
              type="button"
              className="small"
              aria-label={`Send a test event to ${webhook.url}`}
              disabled={test.isPending}
              onClick={() => test.mutate()}
            >
              {test.isPending ? "Sending…" : "Send test event"}
            </button>
            <ConfirmAction
              label="Delete"
              name={`Delete webhook ${webhook.url}`}
              question={`Delete the webhook to ${webhook.url}? Its pending deliveries are never sent.`}
              action={remove}
            />
          </div>
          {test.error && (
            <div className="field-error" role="alert">
              {messageOf(test.error)}
            </div>
          )}
        </td>
      </tr>
      {open && (
        <tr className="log-row" id={logId}>
          <td colSpan={3}>
            <WebhookDeliveries webhook={webhook} />
          </td>
        </tr>
      )}
    </>
  );
}

function CreateWebhook() {
  const [url, setUrl] = useState("");
  const [events, setEvents] = useState<WebhookEvent[]>([]);
  const [description, setDescription] = useState("");
  const [secret, setSecret] = useState<string | null>(null);
  const { errors, setErrors, formError, fromError, clear } = useFieldErrors(["url", "events", "description"]);
  const queryClient = useQueryClient();
  const create = useMutation({
    mutationFn: (body: { url: string; events: WebhookEvent[]; description: string }) =>
      must(api.POST("/api/webhooks", { body })),
    gcTime: 0, // with reset() below, the answer (the secret) leaves TanStack's cache at once
    onSuccess: (created) => {
      setSecret(created.secret);
      setUrl("");
      setEvents([]);
      setDescription("");
      create.reset();
      queryClient.invalidateQueries({ queryKey: ["webhooks"] });
    },
    onError: fromError,
  });

  function toggle(event: WebhookEvent, on: boolean) {
    setEvents((chosen) => (on ? [...chosen, event] : chosen.filter((e) => e !== event)));
  }

  function submit(e: FormEvent) {
    e.preventDefault();
    clear();
    setSecret(null);
    const trimmed = url.trim();
    const next: Record<string, string> = {};
    if (!trimmed) next.url = "Enter the URL that events are POSTed to";
    else if (trimmed.length > URL_MAX) next.url = `A URL has at most ${URL_MAX} characters`;
    if (events.length === 0) next.events = "Choose at least one event";
    if (description.length > DESCRIPTION_MAX) next.description = `At most ${DESCRIPTION_MAX} characters`;
    if (Object.keys(next).length) return setErrors(next);
    // In the schema's order, whatever order they were ticked in.
    create.mutate({ url: trimmed, events: EVENT_NAMES.filter((n) => events.includes(n)), description });
  }

  return (
    <form onSubmit={submit} className="card" aria-label="Create a webhook" noValidate>
      <h3>Add an endpoint</h3>
      <Field
        id="webhook-url"
        label="Endpoint URL"
        error={errors.url}
        hint="http(s), on a public address: private and loopback addresses are refused."
      >
        <input
          {...described("webhook-url", errors.url, true)}
          type="url"
          inputMode="url"
          value={url}
          maxLength={URL_MAX}
          placeholder="https://ci.example.com/specdeck"
          autoComplete="off"
          spellCheck={false}
          onChange={(e) => setUrl(e.target.value)}
        />
      </Field>
      <fieldset
        className={`events${errors.events ? " invalid" : ""}`}
        aria-describedby={errors.events ? "webhook-events-error" : undefined}
      >
        <legend>Events</legend>
        {EVENT_NAMES.map((name) => (
          <label className="check" key={name}>
            <input type="checkbox" checked={events.includes(name)} onChange={(e) => toggle(name, e.target.checked)} />
            <span>
              <code>{name}</code> <span className="dim">{EVENTS[name]}</span>
            </span>
          </label>
        ))}
        {errors.events && (
          <small className="field-error" id="webhook-events-error" role="alert">
            {errors.events}
          </small>
        )}
      </fieldset>
      <Field id="webhook-description" label="Description" error={errors.description} hint="Optional: what receives them.">
        <input
          {...described("webhook-description", errors.description, true)}
          value={description}
          maxLength={DESCRIPTION_MAX}
          autoComplete="off"
          onChange={(e) => setDescription(e.target.value)}
        />
      </Field>
      <FormError message={formError} />
      <button type="submit" className="primary" disabled={create.isPending}>
        {create.isPending ? "Adding…" : "Add endpoint"}
      </button>
      {secret && (
        <ShownOnce name="New webhook secret" label="Signing secret" text={secret} onDismiss={() => setSecret(null)}>
          <strong>Store this signing secret now: it will not be shown again.</strong> Receivers verify each
          event's <code>webhook-signature</code> header with it.
        </ShownOnce>
      )}
    </form>
  );
}

export default function Webhooks() {
  const cursor = useCursor();
  const webhooks = useQuery({
    queryKey: ["webhooks", cursor.after],
    queryFn: () => must(api.GET("/api/webhooks", { params: { query: { limit: 20, after: cursor.after } } })),
  });
  return (
    <section aria-label="Webhooks" className="settings-section">
      <h2>Webhooks</h2>
      <p className="hint">
        Endpoints that this project's events are POSTed to, signed the Standard Webhooks way. A delivery that fails
        is retried, further and further apart; each endpoint's log shows every attempt.
      </p>
      <div className="split">
        <QueryState
          query={webhooks}
          what="Loading webhooks"
          isEmpty={(page) => page.data.length === 0}
          empty={<p>No webhooks yet. Add an endpoint to hear when jobs finish and deployments are ready.</p>}
        >
          {(page) => (
            <>
              <div className="table-wrap">
                <table aria-label="Webhooks" className="webhooks">
                  <thead>
                    <tr>
                      <th>Endpoint</th>
                      <th className="hide-narrow">Created</th>
                      <th>
                        <span className="sr-only">Actions</span>
                      </th>
                    </tr>
                  </thead>
                  <tbody>
                    {page.data.map((w) => (
                      <WebhookRow key={w.id} webhook={w} />
                    ))}
                  </tbody>
                </table>
              </div>
              <Pager cursor={cursor} hasMore={page.has_more} lastId={page.last_id} />
            </>
          )}
        </QueryState>
        <CreateWebhook />
      </div>
    </section>
  );
}
