// A row action that asks first (window.confirm), runs a mutation, and shows the API's refusal
// (a 409 for a dataset in use, say) beside the button.
import type { UseMutationResult } from "@tanstack/react-query";
import { messageOf } from "../api/errors";

export function ConfirmAction({
  label,
  name,
  question,
  action,
  unavailable,
}: {
  label: string; // the button's text
  name: string; // its accessible name, e.g. "Delete dataset demo"
  question: string;
  action: UseMutationResult<unknown, Error, void>;
  unavailable?: string; // why it can't be done now: the button is disabled and says so
}) {
  return (
    <>
      <button
        type="button"
        className="danger small"
        aria-label={name}
        aria-description={unavailable}
        title={unavailable}
        disabled={action.isPending || unavailable !== undefined}
        onClick={() => window.confirm(question) && action.mutate()}
      >
        {label}
      </button>
      {unavailable && (
        // In text, not only a tooltip: phones show no tooltips.
        <div className="hint unavailable" data-testid="unavailable">
          {unavailable}
        </div>
      )}
      {action.error && (
        <div className="field-error" role="alert">
          {messageOf(action.error)}
        </div>
      )}
    </>
  );
}
