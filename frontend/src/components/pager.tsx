// Cursor pagination over the API's lists ({data, has_more, last_id}; `after` for the next page).
import { useState } from "react";

export function useCursor() {
  const [stack, setStack] = useState<string[]>([]);
  const after = stack.length ? stack[stack.length - 1] : undefined;
  return {
    after,
    page: stack.length + 1,
    next: (lastId: string) => setStack((s) => [...s, lastId]),
    prev: () => setStack((s) => s.slice(0, -1)),
    reset: () => setStack([]),
  };
}

export function Pager({
  cursor,
  hasMore,
  lastId,
}: {
  cursor: ReturnType<typeof useCursor>;
  hasMore: boolean;
  lastId: string | number | null | undefined;
}) {
  if (cursor.page === 1 && !hasMore) return null;
  return (
    <nav className="pager" aria-label="Pages">
      <button type="button" onClick={cursor.prev} disabled={cursor.page === 1}>
        ← Newer
      </button>
      <span>Page {cursor.page}</span>
      <button type="button" onClick={() => lastId != null && cursor.next(String(lastId))} disabled={!hasMore}>
        Older →
      </button>
    </nav>
  );
}
