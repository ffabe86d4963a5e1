// A row action that asks first (window.confirm), runs a mutation, and shows the API's refusal
// (a 409 for a dataset in use, say) beside the button.
import type { UseMutationResult } from "@tanstack/react-query";
import { messageOf } from "../api/errors";

export function ConfirmAction({
  label,
  name,
  question,
  action,
}: {
  label: string; // the button's text
  name: string; // its accessible name, e.g. "Delete dataset demo"
  question: string;
  action: UseMutationResult<unknown, Error, void>;
}) {
  return (
    <>
      <button
        type="button"
        className="danger small"
        aria-label={name}
        disabled={action.isPending}
        onClick={() => window.confirm(question) && action.mutate()}
      >
        {label}
      </button>
      {action.error && (
        <div className="field-error" role="alert">
          {messageOf(action.error)}
        </div>
      )}
    </>
  );
}
