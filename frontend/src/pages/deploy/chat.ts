// One streamed chat completion through the gateway (POST /v1/chat/completions, stream: true):
// OpenAI server-sent events, `data: {chunk}` lines ending with `data: [DONE]`, or a final
// `data: {"error": {...}}` when the model server dies mid-stream (app/api/openai.py).
import { authedFetch } from "../../api/client";
import { ApiError, type ErrorBody } from "../../api/errors";
import { readSse } from "../../api/sse";

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

export interface ChatStats {
  /** From sending the request to the first content. */
  ttftMs: number | null;
  /** From sending the request to the end of the stream. */
  totalMs: number;
  /** Completion tokens: the gateway's usage when it sent one, else the content chunks counted. */
  tokens: number;
  tokensFrom: "usage" | "chunks";
  finishReason: string | null;
  /** This request's own acceptance length (vLLM's per-request speculative decoding metrics,
   * on the stream's last chunk): tokens per verifier pass; null without speculation. */
  acceptanceLength: number | null;
  draftSteps: number | null;
}

interface Chunk {
  choices?: { delta?: { content?: string | null }; finish_reason?: string | null }[];
  usage?: { completion_tokens?: number } | null;
  metrics?: { speculative_decoding?: { mean_acceptance_length?: number; num_spec_steps?: number } } | null;
  error?: ErrorBody;
}

export async function streamChat({
  model,
  messages,
  maxTokens,
  temperature,
  signal,
  onText,
}: {
  model: string;
  messages: ChatMessage[];
  maxTokens: number;
  temperature: number;
  signal: AbortSignal;
  onText: (text: string, stats: ChatStats) => void;
}): Promise<ChatStats> {
  const started = performance.now();
  const stats: ChatStats = {
    ttftMs: null,
    totalMs: 0,
    tokens: 0,
    tokensFrom: "chunks",
    finishReason: null,
    acceptanceLength: null,
    draftSteps: null,
  };
  let chunks = 0;
  let usageTokens: number | null = null;
  const response = await authedFetch("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({
      model,
      messages,
      max_tokens: maxTokens,
      temperature,
      stream: true,
      // The gateway then passes the usage chunk on (it asks for it anyway, and drops it otherwise).
      stream_options: { include_usage: true },
    }),
    signal,
  });
  const finish = () => {
    stats.totalMs = performance.now() - started;
    stats.tokens = usageTokens ?? chunks;
    stats.tokensFrom = usageTokens !== null ? "usage" : "chunks";
    return stats;
  };
  for await (const event of readSse(response, signal)) {
    if (event.data === "[DONE]") break;
    let chunk: Chunk;
    try {
      chunk = JSON.parse(event.data) as Chunk;
    } catch {
      continue; // not a JSON chunk: nothing to show
    }
    if (chunk.error) throw new ApiError(502, chunk.error);
    if (typeof chunk.usage?.completion_tokens === "number") usageTokens = chunk.usage.completion_tokens;
    const spec = chunk.metrics?.speculative_decoding;
    if (spec && typeof spec.num_spec_steps === "number" && spec.num_spec_steps > 0) {
      stats.draftSteps = spec.num_spec_steps;
      stats.acceptanceLength = typeof spec.mean_acceptance_length === "number" ? spec.mean_acceptance_length : null;
    }
    const choice = chunk.choices?.[0];
    if (choice?.finish_reason) stats.finishReason = choice.finish_reason;
    const text = choice?.delta?.content;
    if (text) {
      if (stats.ttftMs === null) stats.ttftMs = performance.now() - started;
      chunks++;
      onText(text, finish());
    }
  }
  if (signal.aborted) throw new DOMException("Stopped", "AbortError");
  return finish();
}

/** Tokens per second over the whole request (time to the first token included). */
export function tokensPerSecond(stats: ChatStats): number | null {
  return stats.totalMs > 0 && stats.tokens > 0 ? stats.tokens / (stats.totalMs / 1000) : null;
}
