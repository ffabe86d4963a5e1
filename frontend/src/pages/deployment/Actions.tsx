// The header's actions: open a ready deployment in the playground, delete it.
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { Link } from "react-router-dom";
import { api, must, type Deployment } from "../../api/client";
import { messageOf } from "../../api/errors";
import { DELETABLE } from "../deploy/common";
import { keys } from "./keys";

export function Actions({ deployment }: { deployment: Deployment }) {
  const queryClient = useQueryClient();
  const remove = useMutation({
    mutationFn: () =>
      must(api.DELETE("/api/deployments/{deployment_id}", { params: { path: { deployment_id: deployment.id } } })),
    onSuccess: (updated) => {
      queryClient.setQueryData(keys.deployment(deployment.id), updated);
      queryClient.invalidateQueries({ queryKey: ["deployments"] });
      queryClient.invalidateQueries({ queryKey: keys.events(deployment.id) });
    },
  });
  return (
    <div className="actions">
      {deployment.status === "ready" && (
        <Link className="button primary" to={`/playground?deployment=${encodeURIComponent(deployment.name)}`}>
          Open in playground
        </Link>
      )}
      {DELETABLE.has(deployment.status) && (
        <button
          type="button"
          className="danger"
          disabled={remove.isPending}
          onClick={() => window.confirm(`Delete deployment "${deployment.name}"? It stops serving.`) && remove.mutate()}
        >
          {remove.isPending ? "Deleting…" : "Delete deployment"}
        </button>
      )}
      {remove.error && (
        <span className="field-error" role="alert">
          {messageOf(remove.error)}
        </span>
      )}
    </div>
  );
}
