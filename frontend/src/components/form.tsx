// Form fields with labels, and API errors shown at the field the error's `param` names.
import { useState, type ReactNode } from "react";
import { ApiError, messageOf } from "../api/errors";

export type FieldErrors = Record<string, string>;

/**
 * Where an API error belongs: the field its `param` names (the last part of a dotted path
 * such as "speculator.block_size" is tried too), or the form as a whole.
 */
export function useFieldErrors(fields: string[]) {
  const [errors, setErrors] = useState<FieldErrors>({});
  const [formError, setFormError] = useState<string | null>(null);

  function fromError(error: unknown) {
    const next: FieldErrors = {};
    let placed = false;
    if (error instanceof ApiError) {
      const params = [error.param, ...(error.body.errors ?? []).map((e) => e.param)];
      for (const param of params) {
        const field = param && fields.find((f) => f === param || param.endsWith(`.${f}`) || f.endsWith(`.${param}`));
        if (field && !next[field]) {
          next[field] = error.message;
          placed = true;
        }
      }
    }
    setErrors(next);
    setFormError(placed ? null : messageOf(error));
  }

  function clear() {
    setErrors({});
    setFormError(null);
  }

  return { errors, setErrors, formError, fromError, clear };
}

export function Field({
  id,
  label,
  error,
  hint,
  children,
}: {
  id: string;
  label: ReactNode;
  error?: string;
  hint?: ReactNode;
  children: ReactNode;
}) {
  return (
    <div className={`field${error ? " invalid" : ""}`}>
      <label htmlFor={id}>{label}</label>
      {children}
      {hint && (
        <small className="hint" id={`${id}-hint`}>
          {hint}
        </small>
      )}
      {error && (
        <small className="field-error" id={`${id}-error`} role="alert">
          {error}
        </small>
      )}
    </div>
  );
}

/** aria attributes for an input inside a Field. */
export function described(id: string, error?: string, hint?: boolean) {
  const ids = [hint ? `${id}-hint` : null, error ? `${id}-error` : null].filter(Boolean);
  return {
    id,
    "aria-invalid": error ? true : undefined,
    "aria-describedby": ids.length ? ids.join(" ") : undefined,
  } as const;
}

export function FormError({ message }: { message: string | null }) {
  if (!message) return null;
  return (
    <div className="state error" role="alert">
      {message}
    </div>
  );
}
