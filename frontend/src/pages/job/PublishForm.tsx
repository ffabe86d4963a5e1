// Publish one checkpoint to the Hugging Face Hub (POST /api/checkpoints/{id}/publish): the
// worker holding it uploads it; the table shows the outcome when it is known.
import { useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { api, must, type Checkpoint } from "../../api/client";
import { ApiError } from "../../api/errors";
import { Field, FormError, described, useFieldErrors } from "../../components/form";
import { epochOf, keys } from "./model";

// app/schemas/jobs.py HF_REPO_ID and RepoId's max_length.
const HF_REPO_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}\/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$/;
const REPO_ID_MAX = 200;

export function PublishForm({
  checkpoint,
  suggested,
  onDone,
}: {
  checkpoint: Checkpoint;
  suggested: string | null;
  onDone: () => void;
}) {
  const [repoId, setRepoId] = useState(checkpoint.hub_repo ?? suggested ?? "");
  const [isPrivate, setPrivate] = useState(true);
  const { errors, setErrors, formError, fromError, clear } = useFieldErrors(["repo_id", "private"]);
  const queryClient = useQueryClient();
  const publish = useMutation({
    mutationFn: () =>
      must(
        api.POST("/api/checkpoints/{checkpoint_id}/publish", {
          params: { path: { checkpoint_id: checkpoint.id } },
          body: { repo_id: repoId.trim(), private: isPrivate },
        }),
      ),
    onSuccess: () => {
      queryClient.invalidateQueries({ queryKey: keys.checkpoints(checkpoint.job_id) });
      onDone();
    },
    onError: fromError,
  });

  function submit(event: FormEvent) {
    event.preventDefault();
    clear();
    const value = repoId.trim();
    if (!value) return setErrors({ repo_id: "Enter a repo id such as 'org/name'" });
    if (value.length > REPO_ID_MAX || !HF_REPO_ID.test(value))
      return setErrors({ repo_id: "must be a Hugging Face repo id such as 'org/name'" });
    publish.mutate();
  }

  const id = `publish-${checkpoint.id}`;
  const needsToken = publish.error instanceof ApiError && publish.error.code === "missing_secret";
  return (
    <form className="publish-form" onSubmit={submit} noValidate aria-label={`Publish checkpoint ${epochOf(checkpoint.epoch)} to the Hub`}>
      <Field id={`${id}-repo`} label="Repo id" error={errors.repo_id} hint="A Hugging Face repo such as org/name">
        <input
          {...described(`${id}-repo`, errors.repo_id, true)}
          value={repoId}
          maxLength={REPO_ID_MAX}
          autoComplete="off"
          spellCheck={false}
          onChange={(e) => setRepoId(e.target.value)}
        />
      </Field>
      <label className="check">
        <input type="checkbox" checked={isPrivate} onChange={(e) => setPrivate(e.target.checked)} />
        Private
      </label>
      {errors.private && (
        <div className="field-error" role="alert">
          {errors.private}
        </div>
      )}
      <FormError message={formError} />
      {needsToken && (
        <p className="hint">
          Save a Hugging Face token as the HF_TOKEN secret in <Link to="/settings">Settings</Link>.
        </p>
      )}
      <div className="actions">
        <button type="submit" className="primary" disabled={publish.isPending}>
          {publish.isPending ? "Publishing…" : "Publish to the Hub"}
        </button>
        <button type="button" onClick={onDone}>
          Close
        </button>
      </div>
    </form>
  );
}
