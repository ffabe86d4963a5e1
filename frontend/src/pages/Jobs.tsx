// Placeholder until this page is written.
export default function Jobs() {
  return <h1>Jobs</h1>;
}
