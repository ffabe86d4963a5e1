// A secret shown once (a new API key, a webhook's signing secret): the caller keeps it in its
// component state only and drops it when the user dismisses this panel or leaves the page.
import type { ReactNode } from "react";
import { CopyBlock } from "./copy";

export function ShownOnce({
  name,
  label,
  text,
  children,
  onDismiss,
}: {
  name: string; // the region's accessible name, e.g. "New API key"
  label: string; // the copy block's caption
  text: string;
  children: ReactNode; // what it is and why to store it now
  onDismiss: () => void;
}) {
  return (
    <div className="shown-once" role="region" aria-label={name}>
      <p>{children}</p>
      <CopyBlock label={label} text={text} />
      <button type="button" onClick={onDismiss}>
        Done, I have stored it
      </button>
    </div>
  );
}
