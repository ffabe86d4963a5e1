// Placeholder until this page is written.
export default function JobDetail() {
  return <h1>JobDetail</h1>;
}
