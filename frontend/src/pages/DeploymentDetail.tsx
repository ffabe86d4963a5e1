// Placeholder until this page is written.
export default function DeploymentDetail() {
  return <h1>DeploymentDetail</h1>;
}
