// The typed API client: openapi-fetch over the types that openapi-typescript generates from
// the API's OpenAPI document (src/api/schema.d.ts; `npm run gen:api`). Every request carries
// the signed-in key as a Bearer token; it is never put in a URL. Any 401 signs the user out.
import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./schema";
import { ApiError } from "./errors";
import { session } from "./session";

export type Schemas = components["schemas"];
export type Job = Schemas["JobOut"];
export type JobEvent = Schemas["EventOut"];
export type Checkpoint = Schemas["CheckpointOut"];
export type Verdict = Schemas["Verdict"];
export type Dataset = Schemas["DatasetOut"];
export type DatasetPreview = Schemas["DatasetPreview"];
export type Deployment = Schemas["DeploymentOut"];
export type Plan = Schemas["PlanOut"];
export type Worker = Schemas["WorkerOut"];
export type ApiKey = Schemas["KeyOut"];
export type Secret = Schemas["SecretOut"];
export type Verifier = Schemas["VerifierOut"];
export type JobCreate = Schemas["JobCreate"];
export type DeploymentCreate = Schemas["DeploymentCreate"];
export type Webhook = Schemas["WebhookOut"];
export type WebhookEvent = Schemas["WebhookCreate"]["events"][number];
export type WebhookDelivery = Schemas["WebhookDeliveryOut"];
export type WebhookAttempt = Schemas["WebhookAttemptOut"];
export type LivePoint = Schemas["LiveMetricPoint"];
export type LiveWindow = Schemas["LiveWindow"];
export type Capture = Schemas["CaptureOut"];
export type CaptureOptions = Schemas["CaptureOptions"];
export type Promotion = Schemas["PromotionOut"];
export type RetrainRequest = Schemas["RetrainRequest"];

const auth: Middleware = {
  onRequest({ request }) {
    const key = session.key();
    if (key && !request.headers.has("Authorization")) {
      request.headers.set("Authorization", `Bearer ${key}`);
    }
    return request;
  },
  onResponse({ response }) {
    if (response.status === 401) session.expired();
    return response;
  },
};

export const api = createClient<paths>({ baseUrl: "" });
api.use(auth);

/** The data of an openapi-fetch result, or throw its error as an ApiError (for TanStack Query). */
export async function must<T>(
  call: Promise<{ data?: T; error?: unknown; response: Response }>,
): Promise<T> {
  const { data, error, response } = await call;
  if (error !== undefined || !response.ok) throw ApiError.from(response.status, error);
  return data as T;
}

/** A raw fetch with the key (for streams and uploads that openapi-fetch does not shape). */
export async function authedFetch(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  const key = session.key();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401) session.expired();
  if (!response.ok) {
    let body: unknown = undefined;
    try {
      body = await response.json();
    } catch {
      /* not JSON */
    }
    throw ApiError.from(response.status, body);
  }
  return response;
}
