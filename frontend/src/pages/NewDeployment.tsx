// Placeholder until this page is written.
export default function NewDeployment() {
  return <h1>NewDeployment</h1>;
}
