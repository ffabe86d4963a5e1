// Relative times, with the absolute time on hover.
import { useEffect, useState } from "react";

function useNow(every = 15_000): number {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), every);
    return () => clearInterval(timer);
  }, [every]);
  return now;
}

export function ago(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 5) return "just now";
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export function RelTime({ at }: { at: string | null | undefined }) {
  const now = useNow();
  if (!at) return <span>—</span>;
  const date = new Date(at);
  return (
    <time dateTime={date.toISOString()} title={date.toLocaleString()}>
      {ago((now - date.getTime()) / 1000)}
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
