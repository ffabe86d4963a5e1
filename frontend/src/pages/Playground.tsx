import { useEffect, useRef, useState, type FormEvent, type KeyboardEvent } from "react";
import { useQuery } from "@tanstack/react-query";
import { Link, useSearchParams } from "react-router-dom";
import { api, must } from "../api/client";
import { ApiError, messageOf } from "../api/errors";
import { Field, described } from "../components/form";
import { ErrorNote, Loading } from "../components/states";
import { streamChat, tokensPerSecond, type ChatMessage, type ChatStats } from "./deploy/chat";
import { isTerminal } from "./deploy/common";
import { TrainingPrompts } from "./deploy/TrainingPrompts";
import "./deploy/deploy.css";

// The gateway's cap on max_tokens is SPECDECK_GATEWAY_MAX_TOKENS; the playground asks for at most this.
const MAX_TOKENS_MAX = 8192;
const TEMPERATURE_MAX = 2;

interface Exchange {
  id: number;
  model: string;
  prompt: string;
  answer: string;
  state: "streaming" | "done" | "stopped" | "error";
  error?: string;
  stats?: ChatStats;
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`;

function Stats({ stats, state }: { stats?: ChatStats; state: Exchange["state"] }) {
  if (!stats) return null;
  const rate = tokensPerSecond(stats);
  const source =
    stats.tokensFrom === "usage"
      ? `${plural(stats.tokens, "token")} from the gateway's usage`
      : `${plural(stats.tokens, "content chunk")} counted (no usage sent)`;
  return (
    <p className="play-stats" title="tok/s: completion tokens over the whole request, time to first token included">
      <span>TTFT {stats.ttftMs === null ? "—" : `${Math.round(stats.ttftMs)} ms`}</span>
      <span>{rate === null ? "— tok/s" : `${rate.toFixed(1)} tok/s`}</span>
      {stats.acceptanceLength !== null && (
        <span
          data-testid="play-acceptance"
          title="This request's mean acceptance length: tokens per verifier pass, from the engine's per-request speculative decoding metrics"
        >
          acceptance length {stats.acceptanceLength.toFixed(2)} over {plural(stats.draftSteps ?? 0, "draft step")}
        </span>
      )}
      <span className="dim">
        {state === "streaming" ? `${plural(stats.tokens, "chunk")} so far` : source}
        {stats.finishReason === "length" && " · cut at max tokens"}
        {state === "stopped" && " · stopped"}
      </span>
    </p>
  );
}

function Turn({ exchange, latest, index }: { exchange: Exchange; latest: boolean; index: number }) {
  const live = latest ? ({ role: "log", "aria-live": "polite", "aria-label": "Answer" } as const) : { "aria-label": `Reply ${index + 1}` };
  return (
    <li className="play-turn">
      <div className="play-msg user">
        <span className="play-who">You</span>
        <div className="play-text">{exchange.prompt}</div>
      </div>
      <div className="play-msg assistant">
        <span className="play-who">
          {exchange.model}
          {exchange.state === "streaming" && <span className="spinner" aria-hidden="true" />}
        </span>
        <div className={`play-text${exchange.state === "error" && !exchange.answer ? " play-failed" : ""}`} {...live}>
          {exchange.answer}
          {!exchange.answer && exchange.state === "streaming" && <span className="dim">Waiting for the first token…</span>}
          {!exchange.answer && exchange.state === "done" && (
            <span className="dim">
              (no text: the model stopped at once
              {exchange.stats?.finishReason ? `, finish_reason "${exchange.stats.finishReason}"` : ""})
            </span>
          )}
          {!exchange.answer && exchange.state === "stopped" && <span className="dim">(stopped before the first token)</span>}
        </div>
        {exchange.error && (
          <div className="state error play-error" role="alert">
            {exchange.error}
          </div>
        )}
        <Stats stats={exchange.stats} state={exchange.state} />
      </div>
    </li>
  );
}

/** Why a request failed, in words, with the gateway's codes made plain. */
function explain(error: unknown): string {
  if (error instanceof ApiError) {
    if (error.code === "model_not_found") return `Not served: ${error.message}`;
    if (error.code === "model_not_ready") return `Not ready yet: ${error.message}`;
    return `${error.status}: ${error.message}`;
  }
  return messageOf(error);
}

export default function Playground() {
  const [search, setSearch] = useSearchParams();
  const wanted = search.get("deployment") ?? "";
  const [model, setModel] = useState(wanted);
  const [message, setMessage] = useState("");
  const [maxTokens, setMaxTokens] = useState("128");
  const [temperature, setTemperature] = useState("0");
  const [exchanges, setExchanges] = useState<Exchange[]>([]);
  const [errors, setErrors] = useState<Record<string, string>>({});
  const abort = useRef<AbortController | null>(null);
  const nextId = useRef(1);
  const listRef = useRef<HTMLOListElement>(null);
  const stick = useRef(true);
  const streaming = exchanges.some((e) => e.state === "streaming");

  const deployments = useQuery({
    queryKey: ["deployments", "all"],
    queryFn: () => must(api.GET("/api/deployments", { params: { query: { limit: 100 } } })),
    // While one is on its way to ready (or away from it), look again.
    refetchInterval: (query) =>
      query.state.data?.data.some((d) => !isTerminal(d) && d.status !== "ready") ? 3000 : 15000,
  });
  const all = deployments.data?.data ?? [];
  const ready = [...new Set(all.filter((d) => d.status === "ready").map((d) => d.name))].sort();
  const readyKey = ready.join("\n");
  const wantedOne = wanted ? all.find((d) => d.name === wanted && !isTerminal(d)) : undefined;

  // Pick ?deployment= (once it is ready), else the first ready one.
  useEffect(() => {
    if (model && ready.includes(model)) return;
    if (wanted && ready.includes(wanted)) setModel(wanted);
    else if (!model && !wanted && ready.length) setModel(ready[0]);
  }, [readyKey, wanted]);

  useEffect(() => {
    return () => abort.current?.abort(); // leaving the page stops the stream
  }, []);
  // Keep the newest text in view while streaming, unless the reader scrolled up.
  useEffect(() => {
    const list = listRef.current;
    if (list && stick.current) list.scrollTop = list.scrollHeight;
  }, [exchanges]);

  function update(id: number, change: Partial<Exchange> | ((e: Exchange) => Partial<Exchange>)) {
    setExchanges((list) =>
      list.map((e) => (e.id === id ? { ...e, ...(typeof change === "function" ? change(e) : change) } : e)),
    );
  }

  function validate(): Record<string, string> {
    const e: Record<string, string> = {};
    // Until the list has loaded, a deployment named by ?deployment= may be sent to (the gateway
    // answers 404 or 503 if it is not ready).
    if (!model || (!deployments.isPending && !ready.includes(model))) e.model = "Choose a ready deployment";
    if (!message.trim()) e.message = "Type a message";
    const m = Number(maxTokens);
    if (!/^\d+$/.test(maxTokens.trim()) || m < 1 || m > MAX_TOKENS_MAX)
      e.max_tokens = `A whole number from 1 to ${MAX_TOKENS_MAX}`;
    const t = Number(temperature);
    if (temperature.trim() === "" || !Number.isFinite(t) || t < 0 || t > TEMPERATURE_MAX)
      e.temperature = `A number from 0 to ${TEMPERATURE_MAX}`;
    return e;
  }

  async function send(event?: FormEvent) {
    event?.preventDefault();
    if (streaming) return;
    const problems = validate();
    setErrors(problems);
    if (Object.keys(problems).length) return;
    // The conversation so far: the exchanges that got an answer.
    const history: ChatMessage[] = exchanges
      .filter((e) => (e.state === "done" || e.state === "stopped") && e.answer)
      .flatMap((e) => [
        { role: "user" as const, content: e.prompt },
        { role: "assistant" as const, content: e.answer },
      ]);
    const prompt = message;
    const id = nextId.current++;
    setExchanges((list) => [...list, { id, model, prompt, answer: "", state: "streaming" }]);
    setMessage("");
    stick.current = true;
    const controller = new AbortController();
    abort.current = controller;
    try {
      const stats = await streamChat({
        model,
        messages: [...history, { role: "user", content: prompt }],
        maxTokens: Number(maxTokens),
        temperature: Number(temperature),
        signal: controller.signal,
        onText: (text, stats) => update(id, (e) => ({ answer: e.answer + text, stats: { ...stats } })),
      });
      update(id, { state: "done", stats });
    } catch (error) {
      if (controller.signal.aborted) update(id, { state: "stopped" });
      else {
        update(id, { state: "error", error: explain(error) });
        if (error instanceof ApiError && error.param === "model") void deployments.refetch(); // the list is stale
      }
    } finally {
      if (abort.current === controller) abort.current = null;
    }
  }

  function onKeyDown(event: KeyboardEvent<HTMLTextAreaElement>) {
    if (event.key === "Enter" && !event.shiftKey && !event.nativeEvent.isComposing) {
      event.preventDefault();
      void send();
    }
  }

  function clear() {
    abort.current?.abort();
    setExchanges([]);
    setErrors({});
  }

  function choose(name: string) {
    setModel(name);
    setSearch(name ? { deployment: name } : {}, { replace: true });
  }

  return (
    <>
      <h1>Playground</h1>
      <div className="play">
        <section className="card play-settings" aria-label="Request options">
          {deployments.isPending ? (
            <Loading what="Loading deployments" />
          ) : deployments.error ? (
            <ErrorNote error={deployments.error} retry={() => deployments.refetch()} />
          ) : (
            <>
              <Field
                id="play-model"
                label="Deployment"
                error={errors.model}
                hint={
                  ready.length === 0 ? (
                    <>
                      No deployment is ready. <Link to="/deployments/new">Create one</Link>, or wait for one that
                      is starting.
                    </>
                  ) : undefined
                }
              >
                <select
                  {...described("play-model", errors.model, ready.length === 0)}
                  value={ready.includes(model) ? model : ""}
                  onChange={(e) => choose(e.target.value)}
                >
                  <option value="" disabled>
                    {ready.length ? "Choose a deployment" : "None ready"}
                  </option>
                  {ready.map((name) => (
                    <option key={name} value={name}>
                      {name}
                    </option>
                  ))}
                </select>
              </Field>
              {wanted && !ready.includes(wanted) && (
                <p className="state play-note" role="status">
                  {wantedOne ? (
                    <>
                      <strong className="mono">{wanted}</strong> is {wantedOne.status}; it is listed here once ready.{" "}
                      <Link to={`/deployments/${wantedOne.id}`}>See the deployment</Link>
                    </>
                  ) : (
                    <>
                      No deployment named <strong className="mono">{wanted}</strong> is serving.
                    </>
                  )}
                </p>
              )}
            </>
          )}
          <div className="grid2">
            <Field id="play-max_tokens" label="Max tokens" error={errors.max_tokens}>
              <input
                {...described("play-max_tokens", errors.max_tokens)}
                type="number"
                inputMode="numeric"
                min={1}
                max={MAX_TOKENS_MAX}
                step={1}
                value={maxTokens}
                onChange={(e) => setMaxTokens(e.target.value)}
              />
            </Field>
            <Field id="play-temperature" label="Temperature" error={errors.temperature}>
              <input
                {...described("play-temperature", errors.temperature)}
                type="number"
                inputMode="decimal"
                min={0}
                max={TEMPERATURE_MAX}
                step={0.1}
                value={temperature}
                onChange={(e) => setTemperature(e.target.value)}
              />
            </Field>
          </div>
          <p className="hint">
            Streams through the OpenAI-compatible gateway at <code>/v1/chat/completions</code> with your key. TTFT: time
            to the first token; tok/s: completion tokens over the whole request.
          </p>
          <TrainingPrompts
            deployment={all.find((d) => d.name === model && d.status === "ready")}
            onPick={(prompt) => {
              setMessage(prompt);
              document.getElementById("play-message")?.focus();
            }}
          />
        </section>

        <section className="card play-chat" aria-label="Conversation">
          {exchanges.length === 0 ? (
            <p className="state empty">Send a message to start a conversation.</p>
          ) : (
            <ol
              className="play-turns"
              ref={listRef}
              onScroll={(e) => {
                const el = e.currentTarget;
                stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
              }}
            >
              {exchanges.map((e, i) => (
                <Turn key={e.id} exchange={e} index={i} latest={i === exchanges.length - 1} />
              ))}
            </ol>
          )}
          <form onSubmit={send} className="play-compose" aria-label="Compose" noValidate>
            <Field id="play-message" label="Message" error={errors.message} hint="Enter sends; Shift+Enter: a new line.">
              <textarea
                {...described("play-message", errors.message, true)}
                value={message}
                rows={3}
                onChange={(e) => setMessage(e.target.value)}
                onKeyDown={onKeyDown}
              />
            </Field>
            <div className="actions">
              <button type="submit" className="primary" disabled={streaming}>
                Send
              </button>
              {streaming && (
                <button type="button" onClick={() => abort.current?.abort()}>
                  Stop
                </button>
              )}
              <button type="button" onClick={clear} disabled={exchanges.length === 0 && !streaming}>
                Clear
              </button>
            </div>
          </form>
        </section>
      </div>
    </>
  );
}
