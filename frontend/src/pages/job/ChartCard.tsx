// One chart in a titled, labelled section, with its own empty state; shared chart settings.
import type { ReactElement, ReactNode } from "react";
import { ResponsiveContainer } from "recharts";
import { Empty } from "../../components/states";

export const COLORS = ["#3b5bdb", "#e8590c", "#2b8a3e", "#ae3ec9", "#1098ad", "#c92a2a", "#f08c00", "#495057"];
export const colorAt = (i: number) => COLORS[i % COLORS.length];
export const DOT = { r: 2 };
export const AXIS = { fontSize: 12, fill: "#5d6878" };
export const tooltipNumber = (value: unknown) =>
  typeof value === "number" ? value.toLocaleString("en-US", { maximumFractionDigits: 4 }) : String(value);

export function ChartCard({
  label,
  hint,
  empty,
  isEmpty,
  height = 220,
  children,
}: {
  label: string;
  hint?: ReactNode;
  empty: ReactNode;
  isEmpty: boolean;
  height?: number;
  children: ReactElement;
}) {
  return (
    <section className="card chart" aria-label={label}>
      <h3>{label}</h3>
      {hint && <p className="hint">{hint}</p>}
      {isEmpty ? (
        <Empty>{empty}</Empty>
      ) : (
        <div className="chart-box" style={{ height }}>
          <ResponsiveContainer width="100%" height="100%">
            {children}
          </ResponsiveContainer>
        </div>
      )}
    </section>
  );
}
