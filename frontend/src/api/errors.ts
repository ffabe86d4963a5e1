// The API's one error shape: {"error": {"message", "type", "param", "code", "errors"?}}.
export interface ErrorBody {
  message: string;
  type?: string;
  param?: string | null;
  code?: string | null;
  errors?: { line?: number | null; message: string; param?: string | null }[];
}

export class ApiError extends Error {
  constructor(
    public status: number,
    public body: ErrorBody,
  ) {
    super(body.message);
  }

  static from(status: number, payload: unknown): ApiError {
    const body = (payload as { error?: ErrorBody } | undefined)?.error;
    if (body && typeof body.message === "string") return new ApiError(status, body);
    return new ApiError(status, { message: `The server answered ${status}` });
  }

  get param(): string | null {
    return this.body.param ?? null;
  }
  get code(): string | null {
    return this.body.code ?? null;
  }
}

/** A message for any thrown value. */
export function messageOf(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof TypeError) return "Cannot reach the SpecDeck API. Is it running?";
  return error instanceof Error ? error.message : String(error);
}
