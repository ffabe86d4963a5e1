// Relative times ("3m ago", "in 5m" for one ahead), with the absolute time on hover.
import { useEffect, useState } from "react";

function useNow(every = 15_000): number {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), every);
    return () => clearInterval(timer);
  }, [every]);
  return now;
}

/** The largest whole unit of a span: "42s", "3m", "2h", "4d". */
function span(s: number): string {
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

export function ago(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  return s < 5 ? "just now" : `${span(s)} ago`;
}

/** For a time ahead (a retry's): "in 5m"; within 5 s, "just now". */
function ahead(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  return s < 5 ? "just now" : `in ${span(s)}`;
}

export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/** ``past``: a time that has happened (created, finished): never shown ahead of this clock,
 * which may run a little behind the server's. */
export function RelTime({ at, past: happened = false }: { at: string | null | undefined; past?: boolean }) {
  const now = useNow();
  if (!at) return <span>—</span>;
  const date = new Date(at);
  const past = happened ? Math.max(0, (now - date.getTime()) / 1000) : (now - date.getTime()) / 1000;
  return (
    <time dateTime={date.toISOString()} title={date.toLocaleString()}>
      {past < 0 ? ahead(-past) : ago(past)}
    </time>
  );
}

/** From start to end (or now, while it runs). */
export function Duration({ from, to }: { from: string | null | undefined; to?: string | null }) {
  const now = useNow(1000);
  if (!from) return <span>—</span>;
  const end = to ? new Date(to).getTime() : now;
  return <span>{duration((end - new Date(from).getTime()) / 1000)}</span>;
}
