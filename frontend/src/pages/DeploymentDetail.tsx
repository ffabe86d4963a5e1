// /deployments/:deploymentId: one deployment, asked for every 2 s until it ends. Its cards are
// in deployment/: the summary, replicas, traffic capture, events, live acceptance, promotions.
import { useQuery } from "@tanstack/react-query";
import { Link, useParams } from "react-router-dom";
import { api, must, type Deployment } from "../api/client";
import { ErrorNote, Loading } from "../components/states";
import { isTerminal } from "./deploy/common";
import { Actions } from "./deployment/Actions";
import { Capture } from "./deployment/Capture";
import { Events } from "./deployment/Events";
import { keys } from "./deployment/keys";
import { LiveAcceptance } from "./deployment/LiveAcceptance";
import { Promotions } from "./deployment/Promotions";
import { Replicas } from "./deployment/Replicas";
import { Snippets } from "./deployment/Snippets";
import { Summary } from "./deployment/Summary";
import "./deploy/deploy.css";
import "./deployment/deployment.css";

function Detail({ deployment }: { deployment: Deployment }) {
  return (
    <>
      <div className="toolbar deploy-head">
        <div>
          <h1>{deployment.name}</h1>
          <div className="mono dim">{deployment.id}</div>
        </div>
        <span className="spacer" />
        <Actions deployment={deployment} />
      </div>
      <div className="split">
        <div>
          <Summary deployment={deployment} />
          <Replicas deployment={deployment} />
          <Capture deployment={deployment} />
          {!isTerminal(deployment) && <Snippets deployment={deployment} />}
        </div>
        <Events deployment={deployment} />
      </div>
      <LiveAcceptance deployment={deployment} />
      <Promotions deployment={deployment} />
    </>
  );
}

export default function DeploymentDetail() {
  const { deploymentId = "" } = useParams();
  const deployment = useQuery({
    queryKey: keys.deployment(deploymentId),
    queryFn: () =>
      must(api.GET("/api/deployments/{deployment_id}", { params: { path: { deployment_id: deploymentId } } })),
    refetchInterval: (query) => (query.state.data && isTerminal(query.state.data) ? false : 2000),
  });
  return (
    <div className="deployment-detail">
      <p className="deploy-crumbs">
        <Link to="/deployments">← Deployments</Link>
      </p>
      {deployment.isPending ? (
        <Loading what="Loading deployment" />
      ) : deployment.data ? (
        <>
          {deployment.error && <ErrorNote error={deployment.error} retry={() => deployment.refetch()} />}
          <Detail deployment={deployment.data} />
        </>
      ) : (
        <ErrorNote error={deployment.error} retry={() => deployment.refetch()} />
      )}
    </div>
  );
}
