// Loading, empty and error states: every page shows one of them until it has data.
import type { ReactNode } from "react";
import { ApiError, messageOf } from "../api/errors";

export function Loading({ what = "Loading" }: { what?: string }) {
  return (
    <p className="state" role="status" aria-live="polite">
      <span className="spinner" aria-hidden="true" /> {what}…
    </p>
  );
}

export function Empty({ children }: { children: ReactNode }) {
  return <div className="state empty">{children}</div>;
}

/** What an error is, in a word: a missing or forbidden thing is not "something went wrong", and
 * asking again (a 4xx) gets the same answer, so only the others offer to try again. */
function headline(error: unknown): { title: string; retryable: boolean } {
  if (error instanceof ApiError && error.status === 404) return { title: "Not found.", retryable: false };
  if (error instanceof ApiError && error.status === 403) return { title: "Not allowed.", retryable: false };
  if (error instanceof ApiError && error.status < 500 && error.status !== 429)
    return { title: "Refused.", retryable: false };
  return { title: "Something went wrong.", retryable: true };
}

export function ErrorNote({ error, retry }: { error: unknown; retry?: () => void }) {
  const { title, retryable } = headline(error);
  return (
    <div className="state error" role="alert">
      <strong>{title}</strong> {messageOf(error)}
      {retry && retryable && (
        <button type="button" className="link" onClick={retry}>
          Try again
        </button>
      )}
    </div>
  );
}

interface QueryLike<T> {
  data: T | undefined;
  error: unknown;
  isPending: boolean;
  refetch: () => unknown;
}

/** Loading, error, empty or the data, for one query. */
export function QueryState<T>({
  query,
  what,
  isEmpty,
  empty,
  children,
}: {
  query: QueryLike<T>;
  what?: string;
  isEmpty?: (data: T) => boolean;
  empty?: ReactNode;
  children: (data: T) => ReactNode;
}) {
  if (query.isPending) return <Loading what={what} />;
  if (query.error || query.data === undefined)
    return <ErrorNote error={query.error} retry={() => query.refetch()} />;
  if (isEmpty?.(query.data)) return <Empty>{empty}</Empty>;
  return <>{children(query.data)}</>;
}
