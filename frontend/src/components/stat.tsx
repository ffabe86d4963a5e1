// A headline number with its label (and a note such as "estimate"), for rows of `.stats`.
export function Stat({ label, value, note }: { label: string; value: string; note?: string }) {
  return (
    <div className="stat">
      <span className="value">{value}</span>
      <span className="label">
        {label}
        {note && <em className="note"> ({note})</em>}
      </span>
    </div>
  );
}
